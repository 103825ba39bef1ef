"""CUDA_LAUNCH_BLOCKING=1 (the spec's cuda_launch_blocking; BigScience tr11-176B-ml.slurm exports it, "do not
remove or the training will hang"): every launch returns only when its kernel has ended, so the host
dispatches each kernel after the previous one ended and the GPU idles for every launch. Worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.replay import ReplayConfig, simulate
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.host import HOST_SYNC_NS
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

from xsim import api

LAUNCH = 1_000  # ns: host_launch_us 1
# One rank, one micro-batch of one GPT-style layer under megatron-deepspeed (BF16_Optimizer's FP32 copy).
ONE = {
    "model": {"name": "tiny", "layers": 1, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 1024,
              "seq_len": 1024, "activation": "gelu", "norm": "layernorm", "linear_bias": True},
    "micro_batches": 1, "schedule": "1f1b", "framework": "megatron-deepspeed", "precision": "bf16",
    "host_launch_us": 1,
    "device_groups": [{"gpu": "A100-80GB", "ranks": [0], "tp": 1, "micro_batch": 1}],
}  # fmt: skip


def _gpu_and_host(nodes: list) -> tuple[list, list]:
    """(GPU nodes, host nodes) of a rank, each in program order."""
    host = [n for n in nodes if n.name.startswith("host:")]
    return [n for n in nodes if not n.name.startswith("host:")], host


def test_every_kernel_waits_for_the_previous_one_by_hand() -> None:
    # Every GPU node after the first is launched by a host node that waits for the GPU node before it and
    # carries that node's launches (1,000 ns each; a backward GEMM op is 2 kernels: 2,000 ns), chained to
    # the previous host node. The first node is launched with the host ahead (no host node). The optimizer's
    # grad-norm read adds 15,000 ns to the next launch (grad_clip's host node: 16,000 ns).
    nodes = generate(load_spec({**ONE, "cuda_launch_blocking": True})).nodes[0]
    gpu, host = _gpu_and_host(nodes)
    by_id = {n.id: n for n in nodes}
    for prev, n in zip(gpu, gpu[1:], strict=False):
        gate = [by_id[d] for d in n.data_deps if by_id[d].name.startswith("host:")]
        assert len(gate) == 1, n.name
        assert prev.id in gate[0].data_deps, (prev.name, n.name)
        ns = A.get_int(gate[0], A.DURATION_NS)
        assert ns % LAUNCH == 0 or (ns - HOST_SYNC_NS) % LAUNCH == 0, (n.name, ns)
    # one host node per GPU node but the first
    assert len(host) == len(gpu) - 1
    clip = next(n for n in host if n.name == "host:grad_clip.opt")
    assert A.get_int(clip, A.DURATION_NS) == HOST_SYNC_NS + LAUNCH
    # without the key the profile has no host timeline at all
    assert _gpu_and_host(generate(load_spec(ONE)).nodes[0])[1] == []


def test_step_time_by_hand(tmp_path: Path) -> None:
    # One rank, one stream: without the key the step is the sum of the GPU nodes' durations; with it each
    # node after the first waits for its launches after the previous one ended, and the grad-norm read
    # (15,000 ns) delays the launch after it: longer by 1,000 ns x the launches of every GPU node after the
    # first + 15,000 ns, i.e. by the host nodes' own durations, summed.
    ends, hosts = [], 0
    for on in (False, True):
        out = str(tmp_path / f"r{int(on)}")
        spec = {**ONE, "name": f"r{int(on)}", "cuda_launch_blocking": on}
        api.generate(load_spec(spec), api.GenerateOptions(out=out, all_ranks=True))
        res = simulate(out, network=None, config=ReplayConfig(comm_mode="measured"))
        ends.append(max(r["end_ns"] for r in res.ops.iter_rows(named=True)))
        if on:
            gpu, host = _gpu_and_host(generate(load_spec(spec)).nodes[0])
            hosts = sum(A.get_int(n, A.DURATION_NS) for n in host)
            launches = hosts - HOST_SYNC_NS
            # 50 GPU nodes, 49 host nodes: 39 of one kernel, 7 of two (the position embedding's forward, the
            # loss's backward, the backward GEMMs of the LM head and the 4 linears: dgrad + wgrad), the loss
            # forward's 6, grad_accum_fp32's 32 (16 parameter tensors x a cast and an add) and grad_clip's 1:
            # 39 + 14 + 6 + 32 + 1 = 92 launches, + the read
            assert (len(gpu), len(host)) == (50, 49)
            assert launches == 92 * LAUNCH
    assert ends[1] - ends[0] == hosts


def test_key_round_trips_and_needs_the_host_thread() -> None:
    spec = {**ONE, "cuda_launch_blocking": True}
    assert spec_to_mapping(load_spec(spec))["cuda_launch_blocking"] is True
    assert "cuda_launch_blocking" not in spec_to_mapping(load_spec(ONE))
    with pytest.raises(SpecError, match="cuda_launch_blocking: true needs the host thread"):
        load_spec({**spec, "host_dispatch": "off"})
    with pytest.raises(SpecError, match="cuda_launch_blocking must be true or false"):
        load_spec({**ONE, "cuda_launch_blocking": "yes"})
