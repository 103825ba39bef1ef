"""The batch's way onto the GPU, once per micro-batch: the host-to-device copy of the data loader's tensors
and their broadcast over the TP group, as each framework's get_batch runs them (spec key `batch_input`).

`megatron` / `megatron-no-mask`: Megatron-LM's get_batch_on_this_tp_rank (megatron/training/utils.py, the
same code at core_v0.6.0, core_r0.7.0, core_r0.8.0, core_r0.9.0, core_r0.10.0 and core_r0.12.0), called by
pretrain_gpt.py get_batch at the start of every forward step, and only on the first and last pipeline
stages (`if (not mpu.is_pipeline_first_stage()) and (not mpu.is_pipeline_last_stage()): return None, ...`;
under interleaving the model chunk's virtual rank decides). On TP rank 0 every tensor of the data loader's
batch is copied host to device, `data[key].cuda(non_blocking=True)`, from pinned memory (the DataLoader's
pin_memory=True, megatron/legacy/data/data_samplers.py): tokens, labels (int64 [b, s]), loss_mask (float32
[b, s]), position_ids (int64 [b, s]) and, when the dataset creates it, attention_mask (bool [b, 1, s, s]:
GPTDatasetConfig.create_attention_mask, `args.create_attention_mask_in_dataloader`, on unless
`--no-create-attention-mask-in-dataloader`; megatron/core/datasets/gpt_dataset.py `torch.tril(...) < 0.5`).
The copy runs on the current (compute) stream: the copy engine moves the bytes, the stream's later kernels
wait for it. Then `torch.distributed.broadcast(item, src, group=tp_group)` for each tensor, in this order:
PP 1 tokens, labels, loss_mask, attention_mask, position_ids; first stage tokens, attention_mask,
position_ids; last stage labels, loss_mask, attention_mask (a None mask is not broadcast).

`nemo`: NeMo's MegatronGPTModel (nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py,
fwd_output_and_loss_func): every rank reads its own batch and copies the keys its stage needs,
`val.cuda(non_blocking=True) if key in required_keys` (PP 1 all; first stage tokens and position_ids, last
stage labels and loss_mask), the attention mask dropped (`get_attention_mask_from_fusion`, default True);
no broadcast.

`none`: not generated (the profile's default outside these two codes: docs/tracegen.md "Batch input").
"""

from __future__ import annotations

from dataclasses import dataclass

from xsim.tracegen.catalog import GpuSpec
from xsim.tracegen.choices import BATCH_INPUTS

__all__ = ["BATCH_INPUTS", "BatchInput", "batch_input", "batch_tensors", "h2d_ns"]

# Bytes per element of the data loader's tensors (megatron/core/datasets/gpt_dataset.py at core_v0.6.0:
# `torch.from_numpy(text).long()`, `torch.ones(seq_length, dtype=torch.float)`, `torch.arange(seq_length,
# dtype=torch.long)`, the mask `attention_mask < 0.5`, a bool tensor).
INT64, FLOAT32, BOOL = 8, 4, 1

# PCIe per direction (bytes/s) between the host and each catalog GPU: the netmodels presets' rates
# (netmodels/presets.py, the paper's Table 5 and the datasheets: PCIe 4.0 x16, 256 Gb/s = 32 GB/s, on the
# A100 and L40S; PCIe 5.0 x16, 512 Gb/s = 64 GB/s, on the H100, H200, B200, H20, MI300X and GB200's PCIe
# figure), repeated here because tracegen does not import netmodels (tests/test_batch_input_path.py keeps
# them equal). V100: PCIe 3.0 x16, 16 GB/s per direction (NVIDIA V100 datasheet: 32 GB/s bidirectional).
PCIE_BYTES_PER_S: dict[str, float] = {
    "A100-40GB": 32e9,
    "A100-80GB": 32e9,
    "H100": 64e9,
    "H200": 64e9,
    "B200": 64e9,
    "GB200": 64e9,
    "H20": 64e9,
    "L40S": 32e9,
    "MI300X": 64e9,
    "V100": 16e9,
}
# Achieved share of that rate for a pinned host-to-device copy: CUDA's bandwidthTest on a DGX A100
# (A100-SXM4-80GB, `--memory=pinned`, 32,000,000 B): 25.7 GB/s host to device, of 32 GB/s = 0.803
# (github.com/gengwg/gpu nvda_gpu_benchmark.md, commit f1ce2499ef). Taken for every PCIe generation
# (PCIe's packet overhead is the same per byte). A microbenchmark, not a training run.
H2D_EFFICIENCY = 25.7 / 32


@dataclass(frozen=True)
class BatchInput:
    """One rank's batch input for one micro-batch: bytes it copies host to device, then broadcasts."""

    copy_bytes: int  # host-to-device bytes on the compute stream (0: no copy)
    broadcasts: tuple[tuple[str, int], ...]  # (tensor, bytes) broadcast over the TP group, in order


NOTHING = BatchInput(0, ())


def batch_tensors(micro_batch: int, seq_len: int, mask: bool) -> dict[str, int]:
    """Bytes of each tensor of a micro-batch's batch (the mask only when the dataset creates it)."""
    bs = micro_batch * seq_len
    out = {"tokens": INT64 * bs, "labels": INT64 * bs, "loss_mask": FLOAT32 * bs}
    if mask:
        out["attention_mask"] = BOOL * bs * seq_len
    out["position_ids"] = INT64 * bs
    return out


# The tensors broadcast (Megatron) or copied (NeMo) by pipeline position: (first, last) stage.
_MEGATRON_BROADCAST = {
    (True, True): ("tokens", "labels", "loss_mask", "attention_mask", "position_ids"),
    (True, False): ("tokens", "attention_mask", "position_ids"),
    (False, True): ("labels", "loss_mask", "attention_mask"),
}
_NEMO_KEYS = {
    (True, True): ("tokens", "labels", "loss_mask", "position_ids"),
    (True, False): ("tokens", "position_ids"),
    (False, True): ("labels", "loss_mask"),
}


def batch_input(mode: str, micro_batch: int, seq_len: int, tp: int, first: bool, last: bool) -> BatchInput:
    """What a rank of a model chunk does for one micro-batch's batch under `mode` (BATCH_INPUTS).

    Megatron's copy is TP rank 0's; it is charged on every TP rank: the others wait for it in the
    broadcast (their forward needs its data), so the replay is the same and the TP ranks stay alike.
    """
    if mode in ("", "none") or not (first or last):
        return NOTHING
    if mode == "nemo":
        tensors = batch_tensors(micro_batch, seq_len, False)
        return BatchInput(sum(tensors[k] for k in _NEMO_KEYS[(first, last)]), ())
    tensors = batch_tensors(micro_batch, seq_len, mode == "megatron")
    sent = (
        () if tp == 1 else tuple((k, tensors[k]) for k in _MEGATRON_BROADCAST[(first, last)] if k in tensors)
    )
    return BatchInput(sum(tensors.values()), sent)


def h2d_ns(nbytes: int, gpu: GpuSpec) -> int:
    """Nanoseconds of a pinned host-to-device copy of `nbytes` to `gpu` (its catalog GPU's PCIe rate, or the
    GPU it is calibrated as; PCIe 4.0 x16 for a GPU with neither), rounded, at least 1 for a copy."""
    rate = PCIE_BYTES_PER_S.get(gpu.name) or PCIE_BYTES_PER_S.get(gpu.calibration_key, 32e9)
    if nbytes <= 0:
        return 0
    return max(1, round(nbytes / (rate * H2D_EFFICIENCY) * 1e9))
