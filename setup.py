"""Packaging beyond pyproject.toml: everything installs under the one package `xsim` (issue 25 item 5).

The repository keeps the user's top-level folders (traces/, tracegen/, replay/, netmodels/, examples/);
the wheel maps each into `xsim` (`xsim.traces`, ..., `xsim.examples`), so nothing of ours lands on the top
level of site-packages beside unrelated distributions that use those names. A mapped package cannot be
expressed next to `packages.find` in pyproject.toml, so the package list lives here.
"""

from setuptools import find_namespace_packages, setup

LIBRARIES = ("traces", "tracegen", "replay", "netmodels")
# Namespace discovery also lists the data folders (tracegen/data, traces/examples/...) that package-data
# ships, which setuptools otherwise warns are "absent from the packages configuration".
_EXCLUDE = ["*__pycache__*"]

setup(
    packages=[
        *find_namespace_packages(include=["xsim", "xsim.*"], exclude=_EXCLUDE),
        *(
            f"xsim.{name}"
            for name in find_namespace_packages(include=[f"{lib}*" for lib in LIBRARIES], exclude=_EXCLUDE)
        ),
        "xsim.examples",
    ],
    package_dir={**{f"xsim.{lib}": lib for lib in LIBRARIES}, "xsim.examples": "examples"},
)
