"""Validate xsim's NCCL mode against published nccl-tests bus bandwidths (docs/netmodels.md).

Each row of scripts/data/nccl_tests_published.yaml (system, nodes, collective, size, published busBw and
its source) is timed with the `analytical` model on `dgx-a100:N` / `dgx-h100:N` (NCCL's choice of
algorithm and protocol unless the row names the algorithm the measurement forced), turned into nccl-tests'
bus bandwidth and compared. Targets: within 10% from 64 MiB up, 25% below (latency-bound sizes).

    python scripts/validate_nccl.py                 # print the table
    python scripts/validate_nccl.py --write         # and write it into docs/netmodels.md

The published numbers are validation only: netmodels/nccl.py's constants come from NVIDIA/nccl's source.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "scripts" / "data" / "nccl_tests_published.yaml"
DOC = ROOT / "docs" / "netmodels.md"
START = "<!-- validate_nccl:start (scripts/validate_nccl.py --write) -->"
END = "<!-- validate_nccl:end -->"
BANDWIDTH_BOUND = 64 << 20  # from this size on the target is 10%, below it 25% (issue 23)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class Row:
    """One published nccl-tests measurement."""

    id: str
    system: str
    nodes: int
    gpu: str
    collective: str
    size: int
    busbw: float  # GB/s
    source: str
    algorithm: str | None = None


@dataclass(frozen=True)
class Result:
    """A row beside xsim's figure."""

    row: Row
    xsim_busbw: float  # GB/s
    choice: str  # algorithm/protocol xsim ran
    error: float  # (xsim - published) / published
    target: float

    @property
    def met(self) -> bool:
        """Whether the error is within the row's target."""
        return abs(self.error) <= self.target


def load_rows(path: Path = DATA) -> tuple[dict[str, str], list[Row]]:
    """The sources and rows of the data file."""
    data = yaml.safe_load(path.read_text())
    rows = [Row(**r) for r in data["rows"]]
    for r in rows:
        if r.source not in data["sources"]:
            raise SystemExit(f"{path}: row {r.id}: unknown source {r.source!r}")
        if r.collective not in KINDS:
            raise SystemExit(f"{path}: row {r.id}: unknown collective {r.collective!r}")
    return data["sources"], rows


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busBw / algBw (doc/PERFORMANCE.md): 2(n-1)/n for AllReduce, (n-1)/n for the others."""
    return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def chakra_size(kind: str, size: int, n: int) -> int:
    """nccl-tests' size (AllGather: the whole output) as Chakra's comm_size (AllGather: per-rank input)."""
    return size // n if kind == "all_gather" else size


def evaluate(row: Row) -> Result:
    """Time one row on xsim's analytical model in NCCL mode."""
    from xsim.netmodels import AnalyticalModel, build_cluster
    from xsim.netmodels.api import CollectiveSpec, simulate_collective
    from xsim.netmodels.cluster import system_cluster

    n = 8 * row.nodes
    topo = build_cluster(system_cluster(row.system, n, [row.gpu] * n))
    model = AnalyticalModel(topo)
    spec = CollectiveSpec(
        row.collective, chakra_size(row.collective, row.size, n), tuple(range(n)), row.algorithm
    )
    t = simulate_collective(model, spec).finish_ns * 1e-9
    busbw = bus_factor(row.collective, n) * row.size / t / 1e9
    choice = model.nccl_choice(spec)
    name = (
        "direct"
        if choice is None
        else f"{'tree' if choice[0] == 'double_binary_tree' else choice[0]}/{choice[1]}"
    )
    target = 0.10 if row.size >= BANDWIDTH_BOUND else 0.25
    return Result(row, busbw, name, busbw / row.busbw - 1, target)


def _size(b: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def table(results: list[Result]) -> str:
    """The Markdown table (deterministic: same inputs, same bytes)."""
    lines = [
        "| row | system | nodes | collective | size | published busBw | source | xsim busBw | xsim ran | error | target |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | ---: | --- | ---: | --- |",
    ]
    for r in results:
        row = r.row
        forced = f" ({row.algorithm})" if row.algorithm else ""
        lines.append(
            f"| {row.id} | {row.system} ({row.gpu}) | {row.nodes} | {row.collective}{forced} | {_size(row.size)} "
            f"| {row.busbw:.2f} | {row.source} | {r.xsim_busbw:.2f} | {r.choice} | {r.error * 100:+.1f}% "
            f"| ±{r.target * 100:.0f}% {'met' if r.met else '**not met**'} |"
        )
    met = sum(r.met for r in results)
    lines.append("")
    lines.append(f"{met} of {len(results)} rows within target.")
    return "\n".join(lines)


def write_doc(text: str, doc: Path = DOC) -> None:
    """Replace the table between the markers of docs/netmodels.md."""
    page = doc.read_text()
    if START not in page or END not in page:
        raise SystemExit(f"{doc}: markers {START!r} / {END!r} not found")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(head + START + "\n" + text + "\n" + END + tail)


def doc_row_ids(doc: Path = DOC) -> list[str]:
    """The row ids of the table written into docs/netmodels.md."""
    page = doc.read_text()
    body = page.split(START, 1)[1].split(END, 1)[0]
    return [
        line.split("|")[1].strip()
        for line in body.splitlines()
        if line.startswith("| ") and "---" not in line
    ][1:]


def main(argv: list[str] | None = None) -> int:
    """Evaluate every row (or --only ids), print the table, optionally write it into the docs page."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table into docs/netmodels.md")
    ap.add_argument("--only", nargs="*", help="row ids to evaluate")
    args = ap.parse_args(argv)
    _, rows = load_rows()
    if args.only:
        rows = [r for r in rows if r.id in args.only]
    text = table([evaluate(r) for r in rows])
    print(text)
    if args.write:
        if args.only:
            raise SystemExit("--write needs every row (drop --only)")
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
