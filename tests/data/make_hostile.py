"""Writes the hostile-input corpus in tests/data/hostile/ (committed; rerun to regenerate identically).

Each file has exactly one defect; tests/test_trace_hostile.py pins what `xsim trace validate` says of it.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from xsim.traces import pb
from xsim.traces.attrs import make_attr, make_node
from xsim.traces.stream import encode_stream

HERE = Path(__file__).resolve().parent / "hostile"


def base_nodes() -> list[pb.Node]:
    """Four valid nodes: compute -> all-reduce -> compute, plus an independent compute."""
    return [
        make_node(0, "embed", pb.COMP_NODE, duration_micros=10),
        make_node(
            1, "ar", pb.COMM_COLL_NODE, data_deps=[0], attrs={"comm_type": pb.ALL_REDUCE, "comm_size": 4096}
        ),
        make_node(2, "head", pb.COMP_NODE, data_deps=[1], duration_micros=20),
        make_node(3, "side", pb.COMP_NODE, duration_micros=5),
    ]


def stream(nodes: list[pb.Node]) -> bytes:
    return encode_stream(pb.GlobalMetadata(version="1.0.0"), nodes)


def main() -> None:
    """Regenerate every file of the corpus."""
    HERE.mkdir(exist_ok=True)
    good = stream(base_nodes())
    files: dict[str, bytes] = {"valid.0.et": good}
    files["empty.0.et"] = b""
    files["truncated.0.et"] = good[:-7]  # cut inside the last node
    # A length prefix that claims 200 bytes with only a few left.
    files["length_past_end.0.et"] = good + bytes([0xC8, 0x01]) + b"\x08\x05"
    rng = random.Random(1234)
    files["garbage.0.et"] = bytes(rng.randrange(256) for _ in range(300))
    files["varint_too_long.0.et"] = good + b"\xff\xff\xff\xff\xff\xff\x01"
    # Wire type 7 does not exist: a flip that makes node #2 undecodable (its first byte, the id tag 0x08,
    # becomes 0x0f).
    meta_len = good[0] + 1
    pos = meta_len
    for _ in range(2):
        pos += good[pos] + 1
    flipped = bytearray(good)
    flipped[pos + 1] ^= 0x07
    files["bitflip.0.et"] = bytes(flipped)
    files["bad_gzip.0.et"] = gzip.compress(good, mtime=0)[:-12]
    cyc = base_nodes()
    cyc[0].data_deps.append(2)  # 0 -> 1 -> 2 -> 0
    files["cycle.0.et"] = stream(cyc)
    dang = base_nodes()
    dang[3].data_deps.append(77)
    files["dangling.0.et"] = stream(dang)
    dup = base_nodes()
    dup[3].id = 1
    files["duplicate_id.0.et"] = stream(dup)
    wrong = base_nodes()
    del wrong[1].attr[:]
    wrong[1].attr.extend(
        [make_attr("comm_type", pb.ALL_REDUCE), make_attr("comm_size", "4096", "string_val")]
    )
    files["wrong_type.0.et"] = stream(wrong)
    enum = base_nodes()
    enum[3].type = 42
    files["unknown_node_type.0.et"] = stream(enum)
    ct = base_nodes()
    del ct[1].attr[:]
    ct[1].attr.extend([make_attr("comm_type", 99), make_attr("comm_size", 4096)])
    files["unknown_comm_type.0.et"] = stream(ct)
    nosize = base_nodes()
    del nosize[1].attr[:]
    nosize[1].attr.append(make_attr("comm_type", pb.ALL_REDUCE))
    files["coll_no_size.0.et"] = stream(nosize)
    p2p = base_nodes()
    p2p.append(make_node(4, "send", pb.COMM_SEND_NODE, attrs={"comm_size": 10, "comm_tag": 1}))
    files["send_no_peer.0.et"] = stream(p2p)
    for name, data in files.items():
        (HERE / name).write_bytes(data)


if __name__ == "__main__":
    main()
