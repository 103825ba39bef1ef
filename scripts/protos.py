"""Regenerate the committed protobuf modules (traces/et_def_pb2.py, traces/et_stream_pb2.py,
tracegen/deployment_pb2.py) with protoc, as the installed package names them (`xsim.traces`, ...).

The folders install as `xsim.traces` and `xsim.tracegen` (setup.py), so protoc must see the .proto files at
`xsim/traces/...`: the generated modules then import each other as `xsim.traces.et_def_pb2`. The checkout
has no such folder, so protoc reads them through a temporary include root of symbolic links.

    python scripts/protos.py              # rewrite the committed modules
    python scripts/protos.py --out DIR    # write them under DIR instead (the tests compare the two)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOS = ("traces/et_def.proto", "traces/et_stream.proto", "tracegen/deployment.proto")


def generate(out: Path) -> list[Path]:
    """Run protoc on every .proto of the project; the generated modules' paths under `out`."""
    from grpc_tools import protoc  # grpcio-tools, a [dev] dependency (pyproject.toml)

    with tempfile.TemporaryDirectory() as tmp:
        inc = Path(tmp) / "include"
        (inc / "xsim").mkdir(parents=True)
        for folder in {p.split("/")[0] for p in PROTOS}:
            (inc / "xsim" / folder).symlink_to(ROOT / folder, target_is_directory=True)
        gen = Path(tmp) / "gen"
        gen.mkdir()
        args = ["protoc", f"-I{inc}", f"--python_out={gen}", *(f"xsim/{p}" for p in PROTOS)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protos: protoc failed on {', '.join(PROTOS)}")
        written = []
        for p in PROTOS:
            name = p.replace(".proto", "_pb2.py")
            dst = out / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(gen / "xsim" / name, dst)
            written.append(dst)
        return written


def main(argv: list[str] | None = None) -> int:
    """Command line: regenerate in place, or under --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT, help="folder to write into (default: the checkout)")
    args = ap.parse_args(argv)
    for path in generate(args.out):
        print(f"protos: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
