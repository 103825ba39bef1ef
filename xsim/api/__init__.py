"""xsim's Python API: what the command line, scripts, tests and sweeps call (docs/api.md).

    from xsim import api
    gen = api.generate("examples/figure1.yaml", api.GenerateOptions(out="out/fig1"))
    run = api.simulate("out/fig1", api.ReplayOptions(network=api.NetworkOptions(model="flow")))
    print(run.result.summary_dict()["iteration_time_ns"])

Every function takes frozen dataclasses (or paths), never parsed command-line arguments.
"""

from xsim.api.compute import build_compute, catalog_device
from xsim.api.generation import (
    Generated,
    GenerateOptions,
    check_cluster,
    generate,
    import_pytorch,
    load_spec,
    plan,
    rewrite,
)
from xsim.api.network import build_network, resolve_model
from xsim.api.options import ComputeOptions, NetworkOptions, OutputOptions, ReplayOptions
from xsim.api.replaying import (
    Replay,
    iteration_cost,
    load_deployment,
    load_trace_set,
    replay_config,
    simulate,
    write_outputs,
)

__all__ = [
    "ComputeOptions",
    "GenerateOptions",
    "Generated",
    "NetworkOptions",
    "OutputOptions",
    "Replay",
    "ReplayOptions",
    "build_compute",
    "build_network",
    "catalog_device",
    "check_cluster",
    "generate",
    "import_pytorch",
    "iteration_cost",
    "load_deployment",
    "load_spec",
    "load_trace_set",
    "plan",
    "replay_config",
    "resolve_model",
    "rewrite",
    "simulate",
    "write_outputs",
]
