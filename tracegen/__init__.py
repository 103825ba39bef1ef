"""The planning layer: model presets, GPU catalog, deployment specs and the per-rank workload generator.

The names below are imported on first use (traces/lazy.py): importing a sub-module (e.g. the reshard
strategy names for the command line's choices) does not load the generator.
"""

from xsim.traces.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "xsim.tracegen.bundle": ["TraceBundle"],
        "xsim.tracegen.spec": ["load_spec"],
        "xsim.tracegen.workload": ["generate"],
    },
)
