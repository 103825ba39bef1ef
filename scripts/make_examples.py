"""Writes the small trace sets bundled in traces/examples/ (rerun to regenerate them byte for byte).

tiny_pipeline: 4 ranks, two pipeline stages of TP 2 ({0,1} -> {2,3}), one micro-batch:
  stage 0: fwd compute 100 us -> TP AllReduce 1 MiB (group "1") -> send activation 2 MiB to rank r+2
  stage 1: recv activation -> fwd compute 150 us -> TP AllReduce 1 MiB (group "2")
Process groups are declared in comm_group.json beside the files.
"""

from __future__ import annotations

import json
from pathlib import Path

from xsim.traces import attrs as A
from xsim.traces import pb
from xsim.traces.traceset import write_trace_set

OUT = Path(__file__).resolve().parents[1] / "traces" / "examples"
MIB = 1 << 20


def tiny_pipeline() -> list[list[pb.Node]]:
    """The four per-rank graphs of tiny_pipeline."""
    ranks = []
    for r in range(4):
        stage = r // 2
        ann = {A.STAGE: stage, A.MICRO_BATCH: 0, A.PHASE: "fwd", A.LAYER: stage + 1}
        if stage == 0:
            nodes = [
                A.make_node(0, "fwd_layer1", pb.COMP_NODE, duration_micros=100, attrs=ann),
                A.make_node(
                    1,
                    "tp_allreduce",
                    pb.COMM_COLL_NODE,
                    data_deps=[0],
                    attrs={"comm_type": pb.ALL_REDUCE, "comm_size": MIB, "pg_name": "1", **ann},
                ),
                A.make_node(
                    2,
                    "send_act",
                    pb.COMM_SEND_NODE,
                    data_deps=[1],
                    attrs={
                        "comm_dst": r + 2,
                        "comm_tag": 100 + r,
                        "comm_size": 2 * MIB,
                        A.PP_BOUNDARY: 1,
                        **ann,
                    },
                ),
            ]
        else:
            nodes = [
                A.make_node(
                    0,
                    "recv_act",
                    pb.COMM_RECV_NODE,
                    attrs={
                        "comm_src": r - 2,
                        "comm_tag": 100 + r - 2,
                        "comm_size": 2 * MIB,
                        A.PP_BOUNDARY: 1,
                        **ann,
                    },
                ),
                A.make_node(1, "fwd_layer2", pb.COMP_NODE, data_deps=[0], duration_micros=150, attrs=ann),
                A.make_node(
                    2,
                    "tp_allreduce",
                    pb.COMM_COLL_NODE,
                    data_deps=[1],
                    attrs={"comm_type": pb.ALL_REDUCE, "comm_size": MIB, "pg_name": "2", **ann},
                ),
            ]
        ranks.append(nodes)
    return ranks


def main() -> None:
    """Regenerate every bundled example."""
    d = OUT / "tiny_pipeline"
    meta = pb.GlobalMetadata(version="1.0.0")
    A.set_attr(meta, "producer", "xsim scripts/make_examples.py")
    write_trace_set(d / "tiny_pipeline", tiny_pipeline(), meta)
    (d / "comm_group.json").write_text(json.dumps({"1": [0, 1], "2": [2, 3]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
