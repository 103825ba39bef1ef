"""Collectives and point-to-point ops of PyTorch traces: kinds, payload sizes, peers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xsim.traces import pb

SEND, RECV = "send", "recv"


@dataclass(frozen=True)
class CommKind:
    """What a communication op does: a Chakra collective type, or point-to-point send/recv."""

    coll: int | None  # pb.ALL_REDUCE, ... ; None for P2P
    p2p: str | None  # "send" | "recv" | None
    payload_input: int  # index of the input holding the data this rank contributes (Chakra's comm_size)
    peer_input: int | None = None  # P2P: index of the peer rank (group-local) in the inputs
    tag_input: int | None = None  # P2P: index of the tag


_AR = CommKind(pb.ALL_REDUCE, None, 0)
_AG = CommKind(pb.ALL_GATHER, None, 1)
_RS = CommKind(pb.REDUCE_SCATTER, None, 1)
_A2A = CommKind(pb.ALL_TO_ALL, None, 1)
_BC = CommKind(pb.BROADCAST, None, 0)
_BAR = CommKind(pb.BARRIER, None, 0)
_SEND = CommKind(None, SEND, 0, peer_input=2, tag_input=3)
_RECV = CommKind(None, RECV, 0, peer_input=2, tag_input=3)

# c10d dispatcher ops (torch/csrc/distributed/c10d/Ops.cpp) -> kind. The payload index follows the op
# schema: all_gather(output_tensors, input_tensors, ...), reduce_scatter(output, input_tensors, ...),
# alltoall_base(output, input, ...). As in Chakra's converter, all-gather counts the local shard and
# reduce-scatter the full input.
C10D_OPS: dict[str, CommKind] = {
    "c10d::allreduce_": _AR,
    "c10d::allreduce_coalesced_": _AR,
    "c10d::allgather_": _AG,
    "c10d::_allgather_base_": _AG,
    "c10d::allgather_coalesced_": _AG,
    "c10d::allgather_into_tensor_coalesced_": _AG,
    "c10d::reduce_scatter_": _RS,
    "c10d::_reduce_scatter_base_": _RS,
    "c10d::reduce_scatter_tensor_coalesced_": _RS,
    "c10d::alltoall_": _A2A,
    "c10d::alltoall_base_": _A2A,
    "c10d::broadcast_": _BC,
    "c10d::barrier": _BAR,
    "c10d::send": _SEND,
    "c10d::recv_": _RECV,
}
# record_function names of the backends: nccl:all_reduce, gloo:all_reduce, ... (one tensor input).
BACKEND_OPS: dict[str, CommKind] = {
    "all_reduce": CommKind(pb.ALL_REDUCE, None, 0),
    "allreduce": CommKind(pb.ALL_REDUCE, None, 0),
    "all_gather": CommKind(pb.ALL_GATHER, None, 0),
    "_allgather_base": CommKind(pb.ALL_GATHER, None, 0),
    "all_gather_into_tensor_coalesced": CommKind(pb.ALL_GATHER, None, 0),
    "reduce_scatter": CommKind(pb.REDUCE_SCATTER, None, 0),
    "_reduce_scatter_base": CommKind(pb.REDUCE_SCATTER, None, 0),
    "all_to_all": CommKind(pb.ALL_TO_ALL, None, 0),
    "all_to_allv": CommKind(pb.ALL_TO_ALL, None, 0),
    "broadcast": CommKind(pb.BROADCAST, None, 0),
    "barrier": CommKind(pb.BARRIER, None, 0),
    "send": CommKind(None, SEND, 0),
    "recv": CommKind(None, RECV, 0),
}


def comm_kind(name: str) -> CommKind | None:
    """Kind of a host op or gloo/nccl record_function name, or None when it is not communication."""
    if name in C10D_OPS:
        return C10D_OPS[name]
    for prefix in ("nccl:", "gloo:"):
        if name.startswith(prefix):
            return BACKEND_OPS.get(name[len(prefix) :])
    return None


def is_nccl_kernel(name: str) -> bool:
    """NCCL device kernels (ncclKernel_* before NCCL 2.19, ncclDevKernel_* after)."""
    return name.startswith(("ncclKernel", "ncclDevKernel"))


def nccl_kernel_coll(name: str) -> int | None:
    """Collective type from an NCCL kernel name (SendRecv kernels return None: look at the launcher)."""
    key = name.lower().replace("_", "").replace("-", "")
    for needle, kind in (
        ("allreduce", pb.ALL_REDUCE),
        ("alltoall", pb.ALL_TO_ALL),
        ("allgather", pb.ALL_GATHER),
        ("reducescatter", pb.REDUCE_SCATTER),
        ("broadcast", pb.BROADCAST),
    ):
        if needle in key:
            return kind
    return None


def _is_tensor(v: Any) -> bool:
    # PyTorch ET tensor encoding: [tensor_id, storage_id, offset, numel, itemsize, device]
    return (
        isinstance(v, list)
        and len(v) == 6
        and all(isinstance(x, int) and not isinstance(x, bool) for x in v[:5])
        and isinstance(v[5], str)
    )


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor value or (nested) list of tensors in ET encoding; 0 for anything else."""
    if _is_tensor(value):
        return int(value[3]) * int(value[4])
    if isinstance(value, list):
        return sum(tensor_bytes(v) for v in value)
    return 0


def payload_bytes(kind: CommKind, inputs: Sequence[Any]) -> int:
    """comm_size of an op: bytes of its payload input (falls back to the first tensor input)."""
    if kind.payload_input < len(inputs):
        size = tensor_bytes(inputs[kind.payload_input])
        if size:
            return size
    for v in inputs:
        size = tensor_bytes(v)
        if size:
            return size
    return 0


def p2p_peer_tag(kind: CommKind, inputs: Sequence[Any]) -> tuple[int | None, int]:
    """(group-local peer rank, tag) of a c10d send/recv op."""
    peer = tag = None
    if kind.peer_input is not None and kind.peer_input < len(inputs):
        peer = inputs[kind.peer_input]
    if kind.tag_input is not None and kind.tag_input < len(inputs):
        tag = inputs[kind.tag_input]
    ok_peer = isinstance(peer, int) and not isinstance(peer, bool)
    ok_tag = isinstance(tag, int) and not isinstance(tag, bool)
    return (peer if ok_peer else None), (tag if ok_tag else 0)
