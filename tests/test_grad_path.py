"""Issue 22: Megatron-LM's 2021 and 2022 gradient paths (tracegen/grad_path.py), pinned by hand.

The model is the GPT-tiny of tests/test_gen_frameworks.py (h 64, FFN 256, 4 heads, vocab 100, LayerNorm,
biases), PP 2, DP 2, 3 micro-batches per replica. Parameters per rank, by hand: stage 0 = embedding 100 x 64
= 6,400 + the learned position table 16 x 64 = 1,024 (the Megatron-LM Embedding of both years) + one layer
(QKV 64 x 192 + 192, out 64 x 64 + 64, up 64 x 256 + 256, down 256 x 64 + 64, two LayerNorms 2 x 128) =
49,984: 57,408 in 14 tensors; stage 1 = the layer + final LayerNorm 128 + head 6,400 = 56,512 in 15 tensors.
"""

from __future__ import annotations

import pytest
from xsim.tracegen import load_spec
from xsim.tracegen.grad_path import GradPath, grad_path
from xsim.tracegen.workload import generate
from xsim.traces import attrs as A
from xsim.traces import pb

GPT = {"name": "gpt-tiny", "layers": 2, "hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 4, "vocab": 100,
       "seq_len": 16, "activation": "gelu", "norm": "layernorm", "linear_bias": True}  # fmt: skip
RANKS = ((0, 57_408, 14), (1, 56_512, 15))  # stages 0 and 1 of replica 0 (ranks 2, 3: replica 1)
# A100 80GB: 2,039 GB/s datasheet x the measured copy fraction 1,727.486 / 1,935 (docs/compute.md); 3.8 us
# launch floor per kernel.
BW = 2039e9 * 1727.486 / 1935
FLOOR = 3.8e-6


def _spec(framework: str, precision: str) -> dict:
    # The vocabulary as given (make_vocab_size_divisible_by 0): Megatron would pad 100 to 128.
    return {"model": {**GPT}, "framework": framework, "precision": precision, "make_vocab_size_divisible_by": 0,
            "parallel": {"gpu": "A100-80GB", "tp": 1, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 6}}  # fmt: skip


def _ns(nbytes: int, kernels: int) -> int:
    return int(max(nbytes / BW, kernels * FLOOR) * 1e9 + 0.5)


@pytest.mark.parametrize(
    ("code", "precision", "want"),
    [
        # 2021 FP16, no buffer: param.grad += g (2+2+2) from the 2nd micro-batch; cat (2+2) and /= DP (2+2);
        # copy back (2+2); .float() (2+4); FP32 optimizer gradients; zero_grad sets None.
        ("megatron-2021", "fp16", GradPath(6, False, 8, 2, 4, 6, 4, 0)),
        # 2021 BF16: contiguous FP32 buffer, hook main_grad.add_(grad) (4+2+4) every micro-batch; /= DP (4+4).
        ("megatron-2021", "bf16", GradPath(10, True, 8, 1, 0, 0, 4, 4)),
        # 2022 BF16: accumulation fused into the wgrad GEMM; /= DP on the FP32 buffer; zeroing it (4).
        ("megatron-2022", "bf16", GradPath(0, True, 8, 1, 0, 0, 4, 4)),
        # 2022 FP16: fusion off, FP16 buffer: add_ (2+2+2) every micro-batch, /= DP (2+2), .float(), zero (2).
        ("megatron-2022", "fp16", GradPath(6, True, 4, 1, 0, 6, 4, 2)),
    ],
)
def test_gradient_path_table_by_hand(code, precision, want):
    assert grad_path(code, precision, 2) == want


def test_megatron_2021_fp16_gradient_nodes_by_hand():
    b = generate(load_spec(_spec("megatron-2021", "fp16")), rewrite=False)
    for rank, p, t in RANKS:
        nodes = b.nodes[rank]
        acc = [n for n in nodes if n.name.startswith("grad_accum")]
        # autograd accumulates from the second micro-batch on: micro-batches 1 and 2, 6 bytes per parameter.
        assert sorted(A.get_int(n, A.MICRO_BATCH) for n in acc) == [1, 2]
        assert {A.get_int(n, A.TENSOR_SIZE) for n in acc} == {6 * p}
        assert {A.get_int(n, A.DURATION_NS) for n in acc} == {_ns(6 * p, t)}
        by = {n.name: n for n in nodes}
        assert A.get_int(by["dp_grad_coalesce.opt"], A.TENSOR_SIZE) == 8 * p
        # The all-reduce reduces the coalesced FP16 buffer: it waits for the coalesce node.
        (ar,) = [n for n in nodes if n.name.startswith("dp_grad_allreduce")]
        assert by["dp_grad_coalesce.opt"].id in ar.data_deps and A.comm_size(ar) == 2 * p
        # the GPU kernels (megatron-2021 generates the host thread since issue 22: its `host:` CPU nodes)
        opt = [n.name for n in nodes if A.get_str(n, A.PHASE) == "opt" and n.type == pb.COMP_NODE
               and not A.is_cpu_op(n)]  # fmt: skip
        assert opt == ["dp_grad_coalesce.opt", "dp_grad_uncoalesce.opt", "main_grad_fp32.opt", "grad_unscale.opt",
                       "grad_norm.opt", "grad_clip.opt", "optimizer.opt", "param_copy.opt"]  # fmt: skip
        size = {n: A.get_int(by[n], A.TENSOR_SIZE) for n in opt}
        # FP32 main gradients: copy back 4, .float() 6, unscale 8, norm 4, clip 8, Adam 4 + 24, copy 4 + 2.
        assert size == {"dp_grad_coalesce.opt": 8 * p, "dp_grad_uncoalesce.opt": 4 * p, "main_grad_fp32.opt": 6 * p,
                        "grad_unscale.opt": 8 * p, "grad_norm.opt": 4 * p, "grad_clip.opt": 8 * p,
                        "optimizer.opt": 28 * p, "param_copy.opt": 6 * p}  # fmt: skip
        assert A.get_int(by["dp_grad_uncoalesce.opt"], A.DURATION_NS) == _ns(4 * p, t)


def test_megatron_2022_paths_by_hand():
    b = generate(load_spec(_spec("megatron-2022", "bf16")), rewrite=False)
    for rank, p, _ in RANKS:
        nodes = b.nodes[rank]
        assert not [n for n in nodes if n.name.startswith("grad_accum")]  # fused into the wgrad GEMM
        by = {n.name: n for n in nodes}
        assert A.get_int(by["dp_grad_coalesce.opt"], A.TENSOR_SIZE) == 8 * p  # FP32 buffer /= DP
        assert A.get_int(by["zero_grad.opt"], A.TENSOR_SIZE) == 4 * p
        assert "main_grad_fp32.opt" not in by and "dp_grad_uncoalesce.opt" not in by
        (ar,) = [n for n in nodes if n.name.startswith("dp_grad_allreduce")]
        assert A.comm_size(ar) == 4 * p  # FP32 all-reduce
    b = generate(load_spec(_spec("megatron-2022", "fp16")), rewrite=False)
    for rank, p, _ in RANKS:
        nodes = b.nodes[rank]
        acc = [n for n in nodes if n.name.startswith("grad_accum")]
        assert sorted(A.get_int(n, A.MICRO_BATCH) for n in acc) == [0, 1, 2]  # into the zeroed FP16 buffer
        assert {A.get_int(n, A.TENSOR_SIZE) for n in acc} == {6 * p}
        by = {n.name: n for n in nodes}
        assert A.get_int(by["main_grad_fp32.opt"], A.TENSOR_SIZE) == 6 * p
        assert A.get_int(by["zero_grad.opt"], A.TENSOR_SIZE) == 2 * p


def test_megatron_core_and_the_distributed_optimizer_keep_their_path():
    # Megatron-Core (and any run with the distributed optimizer) has none of the legacy nodes.
    for spec in (
        _spec("megatron-core", "fp16"),
        {**_spec("megatron-2021", "bf16"), "distributed_optimizer": True},
    ):
        b = generate(load_spec(spec), rewrite=False)
        names = {n.name.split(".")[0] for r in b.nodes.values() for n in r}
        assert not names & {"grad_accum", "dp_grad_coalesce", "dp_grad_uncoalesce", "main_grad_fp32"}
