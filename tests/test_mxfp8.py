"""`fp8_recipe: mxfp8` (Transformer Engine's MXFP8BlockScaling, Megatron-Bridge's "fp8_mx"): one fused
quantize per FP8 operand writes the row-wise and column-wise FP8 copies and their E8M0 scales (one byte per
block of 32), no amax, no history; each against a hand count."""

from __future__ import annotations

import pytest
from xsim.tracegen import generate, load_spec
from xsim.tracegen.errors import SpecError
from xsim.tracegen.ops import mx_written_bytes
from xsim.tracegen.spec import spec_to_mapping
from xsim.traces import attrs as A

TINY = {"name": "tiny", "layers": 1, "hidden": 64, "ffn_hidden": 128, "heads": 4, "vocab": 256, "seq_len": 8}


def _spec(recipe: str, **extra: object) -> dict:
    spec = {"model": TINY, "precision": "fp8", "parallel": {"gpu": "B200"}, "micro_batches": 1}
    return {**spec, "fp8_recipe": recipe, **extra}


def _nodes(spec: dict) -> dict:
    bundle = generate(load_spec(spec), rewrite=False)
    return {n.name: {a.name: a for a in n.attr} for n in bundle.nodes[0]}


def _value(attr):  # noqa: ANN001, ANN202
    return getattr(attr, attr.WhichOneof("value"))


def _size(nodes: dict, name: str) -> int:
    return nodes[name][A.TENSOR_SIZE].uint64_val


def test_mx_written_bytes_by_hand() -> None:
    # 1,024 elements: 2 x 1,024 FP8 bytes + 2 x 32 scale bytes; 33 elements: 66 + 2 x 2 (a partial block)
    assert mx_written_bytes(1024) == 2_112
    assert mx_written_bytes(33) == 70


def test_mxfp8_node_list_and_bytes_by_hand() -> None:
    """Tiny model (hidden 64, 8 tokens, 4 heads of 16, SwiGLU FFN 128, BF16 activations, TP 1) on a B200."""
    delayed, mx = _nodes(_spec("delayed")), _nodes(_spec("mxfp8"))
    layer = lambda ns, p: [n.split(".")[1] for n in ns if n.startswith("L1.") and f".{p}." in n]  # noqa: E731
    assert layer(mx, "fwd") == [
        "attn_norm", "qkv_proj_fp8_cast", "qkv_proj_fp8_swizzle", "qkv_proj", "rope", "attn_core",
        "attn_out_proj_fp8_cast", "attn_out_proj_fp8_swizzle", "attn_out_proj", "attn_bias_dropout_add",
        "mlp_norm", "mlp_up_gate_fp8_cast", "mlp_up_gate_fp8_swizzle", "mlp_up_gate", "mlp_act",
        "mlp_down_fp8_cast", "mlp_down_fp8_swizzle", "mlp_down", "mlp_bias_dropout_add",
    ]  # fmt: skip
    # no amax history (no concat, reduction or scale update) and no backward transpose of a LayerNormLinear's
    # input: its forward quantize wrote the column-wise copy
    assert not any("amax" in n or "scale_update" in n or "fp8_transpose" in n for n in mx)
    assert "L1.qkv_proj_fp8_transpose.bwd.mb0" in delayed
    e = 8 * 64  # a norm's 512 elements: the norm reads and writes BF16 (TE's unfused MXFP8 norm)
    assert _size(mx, "L1.attn_norm.fwd.mb0") == e * (2 + 2)
    # its quantize: read 2 x 512, write 2 x 512 FP8 + 2 x 16 scales = 1,024 + 1,056 = 2,080 B
    assert _size(mx, "L1.qkv_proj_fp8_cast.fwd.mb0") == 2_080
    # a Linear's input, 8 x 128 = 1,024: read 2,048 + write 2,048 + 64 scales = 4,160 (delayed: 4,096)
    assert _size(mx, "L1.mlp_down_fp8_cast.fwd.mb0") == 4_160
    assert _size(delayed, "L1.mlp_down_fp8_cast.fwd.mb0") == 4_096
    # backward output gradient of the SwiGLU up/gate, 8 x 256 = 2,048: 4,096 + 4,096 + 128 = 8,320
    assert _size(mx, "L1.mlp_up_gate_fp8_cast.bwd.mb0") == 8_320
    # the weight quantize after the step: 40,960 linear weights (64 x 192 + 64 x 64 + 64 x 256 + 128 x 64):
    # read 81,920 + write 81,920 + 2 x 1,280 scales = 166,400 B
    assert _size(mx, "fp8_weight_cast.opt") == 166_400
    # one kernel per quantize (launch-bound here at 3.8 us); the GEMMs at the FP8 peak as under delayed
    dur = lambda ns, n: _value(ns[n][A.DURATION_NS])  # noqa: E731
    assert dur(mx, "L1.mlp_down_fp8_cast.fwd.mb0") == 3_800
    assert dur(mx, "L1.qkv_proj.fwd.mb0") == dur(delayed, "L1.qkv_proj.fwd.mb0")
    assert dur(mx, "L1.mlp_down.bwd.mb0") == dur(delayed, "L1.mlp_down.bwd.mb0")


def test_mxfp8_scale_swizzles_by_hand() -> None:
    """TE v2.9 swizzles each MXFP8 operand's E8M0 scales before every GEMM (gemm.cpp swizzle_scaling_factors):
    2 kernels forward (input, weight), 4 backward (dgrad: output gradient row-wise, weight column-wise; wgrad:
    input and output gradient column-wise), each reading and writing one byte per block of 32. Tiny model:
    8 tokens, hidden 64, QKV width (4 + 2 x 4) x 16 = 192, FFN 128."""
    delayed, mx = _nodes(_spec("delayed")), _nodes(_spec("mxfp8"))
    assert not any("swizzle" in n for n in delayed)
    bwd = [n.split(".")[1] for n in mx if n.startswith("L1.") and ".bwd." in n and "swizzle" in n]
    assert bwd == [
        "mlp_down_fp8_swizzle",
        "mlp_up_gate_fp8_swizzle",
        "attn_out_proj_fp8_swizzle",
        "qkv_proj_fp8_swizzle",
    ]
    # qkv_proj forward: input 8 x ceil(64/32) = 16 + weight 192 x 2 = 384 -> 400 scales, read + write 800 B
    assert _size(mx, "L1.qkv_proj_fp8_swizzle.fwd.mb0") == 800
    # backward: dY row-wise 8 x ceil(192/32) = 48, W column-wise ceil(192/32) x 64 = 384, X column-wise
    # ceil(8/32) x 64 = 64, dY column-wise 1 x 192 = 192 -> 688 scales, 1,376 B
    assert _size(mx, "L1.qkv_proj_fp8_swizzle.bwd.mb0") == 1_376
    # mlp_down [8, 128] x [128, 64]: forward 8 x 4 + 64 x 4 = 288 -> 576 B; backward 8 x 2 + 2 x 128 +
    # 1 x 128 + 1 x 64 = 464 -> 928 B
    assert _size(mx, "L1.mlp_down_fp8_swizzle.fwd.mb0") == 576
    assert _size(mx, "L1.mlp_down_fp8_swizzle.bwd.mb0") == 928
    # launch-bound: 2 and 4 kernels at the 3.8 us floor
    dur = lambda n: _value(mx[n][A.DURATION_NS])  # noqa: E731
    assert dur("L1.qkv_proj_fp8_swizzle.fwd.mb0") == 7_600
    assert dur("L1.qkv_proj_fp8_swizzle.bwd.mb0") == 15_200


def test_mxfp8_quantize_at_its_measured_b200_rate() -> None:
    """TE's MXFP8 quantize (both copies) moves its bytes at its measured B200 rate, 52.34 us for BF16
    8192 x 8192 (ROCm/TransformerEngine pull 598, B200 column): 272,629,760 B in 52.34 us = 0.6511 of 8 TB/s,
    not the B200's stream rate (0.8401 of it); the GB200 borrows it, FP8-CS casts and other GPUs keep the copy
    rate."""
    from xsim.tracegen.catalog import gpu
    from xsim.tracegen.ops import MX_QUANTIZE_KERNEL, Op, op_seconds

    def us(name: str, elems: int, kernel: str = MX_QUANTIZE_KERNEL) -> float:
        op = Op(
            "mlp_down_fp8_cast", "fwd", 0, 2 * elems + mx_written_bytes(elems), (elems,), False, kernel=kernel
        )
        return op_seconds(op, gpu(name), "calibrated") * 1e6

    # the calibration point reproduces itself
    assert us("B200", 8192 * 8192) == pytest.approx(52.34, abs=1e-6)
    # Llama 3 8B's mlp_down input, 2 x 8192 tokens x 14,336 = 234,881,024 elements: 469,762,048 read +
    # 469,762,048 + 14,680,064 written = 954,204,160 B / (0.651103 x 8e12) = 183.19 us
    e = 16384 * 14336
    assert us("B200", e) == pytest.approx(183.19, abs=0.01)
    assert us("GB200", e) == pytest.approx(183.19, abs=0.01)
    # without the tag (an FP8-CS cast): the B200's measured stream rate, CUB's DeviceTransform add of 2^28
    # FP16 elements, 1,610,612,736 B in 239.643 us = 6,720.88 GB/s (NVIDIA/cccl pull 7391): 141.98 us
    assert us("B200", e, kernel="") == pytest.approx(954_204_160 / 6.72088e12 * 1e6, abs=0.01)
    assert us("B200", e, kernel="") == pytest.approx(141.98, abs=0.01)
    # a GPU without the measurement: its copy rate (H100 2,903 GB/s measured): 328.70 us
    assert us("H100", e) == pytest.approx(954_204_160 / 2.903e12 * 1e6, abs=0.01)


def test_mxfp8_params_gather_in_bf16_then_quantize() -> None:
    """fp8_params under MXFP8 (Megatron-Bridge bf16_with_mxfp8_mixed: reuse_grad_buf_for_mxfp8_param_ag): the
    distributed optimizer's AllGather moves BF16, 2 bytes a weight, where delayed FP8 parameters move 1."""
    extra = {"parallel": {"gpu": "B200", "dp": 2}, "distributed_optimizer": True, "fp8_params": True}

    def gathers(recipe: str, params: bool) -> list[int]:
        spec = _spec(recipe, **{**extra, "fp8_params": params})
        nodes = generate(load_spec(spec), rewrite=False).nodes[0]
        return [
            _value({a.name: a for a in n.attr}[A.COMM_SIZE]) for n in nodes if "param_allgather" in n.name
        ] or [-1]

    mx, mx_plain, delayed = gathers("mxfp8", True), gathers("mxfp8", False), gathers("delayed", True)
    assert mx == mx_plain and sum(mx) > 0
    # delayed FP8 parameters: each rank's 20,480 FP8 weights (40,960 / 2) at 1 byte instead of 2
    assert sum(mx) - sum(delayed) == 20_480
    nodes = _nodes(_spec("mxfp8", **extra))
    assert _size(nodes, "fp8_weight_cast.opt") == 166_400


def test_mxfp8_refusals_and_round_trip() -> None:
    assert spec_to_mapping(load_spec(_spec("mxfp8")))["fp8_recipe"] == "mxfp8"
    cases = [
        (_spec("mxfp8", precision="bf16"), "fp8_recipe: mxfp8 needs precision: fp8"),
        (_spec("mxfp8", sequence_parallel=True, parallel={"gpu": "B200", "tp": 2}), "sequence_parallel"),
        (
            _spec("mxfp8", model={**TINY, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 64}}),
            "dense models only",
        ),
    ]
    for spec, words in cases:
        with pytest.raises(SpecError) as exc:
            load_spec(spec)
        assert words in str(exc.value) and "\n" not in str(exc.value)


def test_b200_memory_bound_ops_at_the_measured_stream_rate() -> None:
    """B200 (and the GB200, calibrated as it): memory-bound kernels at CUB's measured DeviceTransform add,
    6,720.88 of 8,000 GB/s = 0.84011 (NVIDIA/cccl pull 7391), not the 0.80 rule of thumb."""
    from xsim.tracegen.catalog import gpu
    from xsim.tracegen.gemm import achieved_bandwidth

    # 3 x 2 x 2^28 = 1,610,612,736 B in 239.643 us
    assert achieved_bandwidth(gpu("B200")) == pytest.approx(6_720.88e9, rel=1e-6)
    assert achieved_bandwidth(gpu("GB200")) == pytest.approx(6_720.88e9, rel=1e-6)
    # the MXFP8 quantize keeps its own measured rate, 272,629,760 B / 52.34 us
    assert achieved_bandwidth(gpu("B200"), "te_mxfp8_quantize") == pytest.approx(5_208.82e9, rel=1e-6)
