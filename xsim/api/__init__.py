"""xsim's Python API: what the command line, scripts, tests and sweeps call (docs/api.md).

    from xsim import api
    gen = api.generate("examples/figure1.yaml", api.GenerateOptions(out="out/fig1"))
    run = api.simulate("out/fig1", api.ReplayOptions(network=api.NetworkOptions(model="flow")))
    print(run.result.summary_dict()["iteration_time_ns"])

Every function takes frozen dataclasses (or paths), never parsed command-line arguments. The names load on
first use (traces/lazy.py): a replay does not import the generation side.
"""

from xsim.traces.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "xsim.api.compute": ["build_compute", "catalog_device"],
        "xsim.api.generation": [
            "Generated",
            "GenerateOptions",
            "check_cluster",
            "generate",
            "import_pytorch",
            "load_spec",
            "plan",
            "rewrite",
        ],
        "xsim.api.network": ["build_network", "resolve_model"],
        "xsim.api.options": ["ComputeOptions", "NetworkOptions", "OutputOptions", "ReplayOptions"],
        "xsim.api.replaying": [
            "Replay",
            "iteration_cost",
            "load_deployment",
            "load_trace_set",
            "replay_config",
            "simulate",
            "write_outputs",
        ],
    },
)
