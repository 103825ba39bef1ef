"""xsim: the application layer (command line, library API, plan search and sweeps) over four libraries.

The libraries install inside this package: `xsim.traces` (the Chakra trace model and file formats),
`xsim.tracegen` (the generator and graph rewriter), `xsim.netmodels` (network models) and `xsim.replay` (the
replayer); docs/architecture.md shows the stages and which module owns each.
"""

import os as _os

# In a checkout the libraries are the sibling folders traces/, tracegen/, replay/, netmodels/ and examples/
# (the user's layout); an installed wheel holds them inside xsim/ (setup.py's package_dir). Searching the
# checkout's root after this folder makes `xsim.traces` the folder traces/ in both cases, with or without an
# install (editable installs put the checkout on sys.path, which reaches this same code).
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "traces")) and _os.path.isfile(
    _os.path.join(_root, "traces", "__init__.py")
):
    __path__.append(_root)
