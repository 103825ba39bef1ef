"""One self-contained HTML page about a replay result folder (`xsim report RESULTDIR --out report.html`).

Plots are matplotlib figures inlined as SVG: matplotlib is already the project's plotting library (the
validation figure), SVG needs no script at view time (so no network, nothing to fail in the console, and
the page prints), and it is deterministic with a fixed hash salt. Plotly would inline ~3.5 MB of
JavaScript per page and altair/vega needs its runtime scripts; neither buys anything for static charts.

Sections: the iteration summary, per-rank stacked time shares (breakdown.rank_breakdown), op time per layer
and per phase, the collectives that left the most communication exposed, a Gantt of a few ranks, and for an
imported run with an `xsim validate --out` folder, the validation figure and its tables.
"""

from __future__ import annotations

import html
import io
import os
from dataclasses import dataclass

import polars as pl
from xsim.replay.errors import ReplayError
from xsim.replay.export.breakdown import (
    CATEGORIES,
    collective_exposure,
    is_pipelined,
    op_time_by,
    rank_breakdown,
    share_column,
)
from xsim.traces.errors import XsimError
from xsim.traces.io import read_json
from xsim.traces.outputs import atomic_write_text

MAX_BARS = 128  # ranks drawn in the stacked-bar chart; larger runs show an evenly spaced sample
GANTT_RANKS = 4  # ranks in the Gantt: rank 0, the last to finish, the one that waited most, ...
TOP_COLLECTIVES = 10
# The ranks table's time columns as `ranks.csv` names them (docs/replay.md), shown under those names.
RANK_COLUMNS = (
    "rank",
    "finish_ns",
    "compute_ns",
    "cpu_ns",
    "comm_ns",
    "exposed_comm_ns",
    "idle_ns",
    "wait_ns",
    "bubble_ns",
)
COLORS = {
    "compute": "#4c72b0",
    "cpu": "#8172b3",
    "exposed_comm": "#dd8452",
    "comm": "#dd8452",
    "wait": "#c44e52",
    "bubble": "#ccb974",
    "idle": "#d9d9d9",
}


GANTT_LABELS = {
    "compute": "GPU compute",
    "comm": "communication (active)",
    "cpu": "CPU op",
    "wait": "waiting for peers",
}


class ReportError(ReplayError):
    """A result folder cannot be reported on (missing or unreadable tables)."""


@dataclass(frozen=True)
class RunTables:
    """What `xsim replay --out` wrote: the public tables and the small JSON files beside them."""

    directory: str
    ops: pl.DataFrame
    ranks: pl.DataFrame
    collectives: pl.DataFrame
    summary: dict
    cost: dict | None
    source: str | None


def load_run(result_dir: str | os.PathLike[str]) -> RunTables:
    """Read a result folder, or one error line naming what is missing."""
    d = os.fspath(result_dir)
    if not os.path.isdir(d):
        raise ReportError(f"{d}: not a folder (pass the folder `xsim replay --out` wrote)")
    tables = {}
    for name in ("ops", "ranks", "collectives"):
        p = os.path.join(d, f"{name}.parquet")
        if not os.path.isfile(p):
            raise ReportError(f"{d}: no {name}.parquet (pass the folder `xsim replay --out` wrote)")
        try:
            tables[name] = pl.read_parquet(p)
        except (pl.exceptions.PolarsError, OSError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ReportError(f"{p}: not a replay table ({first})") from None
    summary = _json(os.path.join(d, "summary.json"), required=True)
    cost = _json(os.path.join(d, "cost.json"), required=False)
    src = _json(os.path.join(d, "source.json"), required=False)
    return RunTables(
        d, tables["ops"], tables["ranks"], tables["collectives"], summary, cost, (src or {}).get("trace")
    )


def _json(path: str, required: bool) -> dict | None:
    if not os.path.isfile(path):
        if required:
            raise ReportError(f"{os.path.dirname(path)}: no {os.path.basename(path)}")
        return None
    try:
        doc = read_json(path)
    except XsimError as exc:  # JsonFileError, InputLimitError: their messages name the file
        raise ReportError(f"{path}: not readable JSON ({getattr(exc, 'reason', exc)})") from None
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: not a JSON object")
    return doc


def _svg(fig) -> str:
    """The figure as inline SVG text (deterministic: fixed hash salt, no date)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": "xsim", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _fmt_ns(ns: int | float) -> str:
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:,.3f} {unit}"
    return f"{ns:,.0f} ns"


def _fmt_bytes(b: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:,.2f} {unit}"
    return f"{b:,} B"


def _table(df: pl.DataFrame, fmt: dict | None = None) -> str:
    fmt = fmt or {}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = []
    for row in df.iter_rows(named=True):
        cells = []
        for c in df.columns:
            v = row[c]
            text = fmt[c](v) if c in fmt and v is not None else ("" if v is None else str(v))
            cls = ' class="num"' if isinstance(v, int | float) else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _summary_html(run: RunTables) -> str:
    s = run.summary
    n = int(s["num_ranks"])
    bubble = (
        "pipeline bubble"
        if is_pipelined(run.ops, int(run.summary.get("num_p2p", 0)))
        else "idle gaps in the compute span (no pipeline)"
    )
    rows = [
        ("iteration time", _fmt_ns(s["iteration_time_ns"])),
        ("ranks / nodes", f"{n:,} / {int(s['num_nodes']):,}"),
        ("collectives / P2P transfers", f"{int(s['num_collectives']):,} / {int(s['num_p2p']):,}"),
        ("bytes moved", _fmt_bytes(int(s["bytes_moved"]))),
        ("network / compute model", f"{s['network_model']} / {s['compute_model']} (comm {s['comm_mode']})"),
        # The summary's own numbers (summary.json, what `xsim replay` prints), never recomputed here.
        (f"straggler waiting (summed over {n} ranks)", _fmt_ns(s["wait_ns_total"])),
        ("straggler waiting, worst rank", _fmt_ns(s["wait_ns_max"])),
        (f"{bubble} (summed over {n} ranks)", _fmt_ns(s["bubble_ns_total"])),
        (f"{bubble}, worst rank", _fmt_ns(s["bubble_ns_max"])),
    ]
    if run.cost:
        c = run.cost
        rows.append(("tokens per second", f"{c.get('tokens_per_s', 0):,.0f}"))
        usd = c.get("cost_usd_per_iteration")
        rows.append(("cost per iteration", "no price in the catalog" if usd is None else f"${usd:,.4f}"))
    if run.source:
        rows.append(("trace set", run.source))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _stacked_bars(br: pl.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if br.height > MAX_BARS:
        step = -(-br.height // MAX_BARS)
        br = br.gather(list(range(0, br.height, step)))
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.22 * br.height + 1.2)))
    left = [0.0] * br.height
    ys = list(range(br.height))
    for cat in CATEGORIES:
        vals = [v / 1e6 for v in br[share_column(cat)]]
        ax.barh(ys, vals, left=left, color=COLORS[cat], label=cat.replace("_", " "), height=0.8)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(ys, [str(r) for r in br["rank"]], fontsize=7 if br.height > 32 else 9)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("rank")
    ax.legend(ncol=6, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _key_bars(df: pl.DataFrame, key: str, xlabel: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * df.height + 2), 3.4))
    xs = list(range(df.height))
    bottom = [0.0] * df.height
    for r in ("compute", "comm", "cpu"):
        vals = [v / 1e6 for v in df[f"{r}_ns"]]
        ax.bar(xs, vals, bottom=bottom, color=COLORS[r], label=r)
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    ax.set_xticks(xs, [str(v) for v in df[key]], rotation=90 if df.height > 20 else 0, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("op time (ms, summed over ranks)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def gantt_ranks(run: RunTables, k: int = GANTT_RANKS) -> list[int]:
    """Rank 0, the last rank to finish, the rank that waited most, then the next ranks by finish time."""
    r = run.ranks.sort("rank")
    picks = [0, int(r.sort(["finish_ns", "rank"], descending=[True, False])["rank"][0])]
    picks.append(int(r.sort(["wait_ns", "rank"], descending=[True, False])["rank"][0]))
    for rank in r.sort(["finish_ns", "rank"], descending=[True, False])["rank"]:
        picks.append(int(rank))
    out: list[int] = []
    for p in picks:
        if p not in out and len(out) < min(k, r.height):
            out.append(p)
    return sorted(out)


def _gantt(run: RunTables, ranks: list[int]):
    import matplotlib.pyplot as plt

    ops = run.ops.filter(pl.col("rank").is_in(ranks) & (pl.col("resource") != "none"))
    lanes = [(r, res) for r in ranks for res in ("compute", "comm", "cpu")]
    lanes = [
        ln for ln in lanes if ops.filter((pl.col("rank") == ln[0]) & (pl.col("resource") == ln[1])).height
    ]
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(lanes) + 1.3))
    for y, (rank, res) in enumerate(lanes):
        part = ops.filter((pl.col("rank") == rank) & (pl.col("resource") == res))
        s = part["start_ns"].to_numpy()
        e = part["end_ns"].to_numpy()
        w = part["wait_ns"].to_numpy()
        if res == "comm":
            waits = [(a / 1e6, b / 1e6) for a, b in zip(s, w, strict=True) if b > 0]
            ax.broken_barh(waits, (y - 0.35, 0.7), facecolors=COLORS["wait"], alpha=0.5)
            s = s + w
        ax.broken_barh(
            [(a / 1e6, (b - a) / 1e6) for a, b in zip(s, e, strict=True)],
            (y - 0.35, 0.7),
            facecolors=COLORS[res],
        )
    ax.set_yticks(range(len(lanes)), [f"rank {r} {res}" for r, res in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, run.summary["iteration_time_ns"] / 1e6 * 1.01)
    # What the colours mean (issue 26 item 9: the Gantt had no legend).
    from matplotlib.patches import Patch

    shown = {res for _, res in lanes}
    keys = [k for k in ("compute", "comm", "cpu") if k in shown]
    handles = [Patch(facecolor=COLORS[k], label=GANTT_LABELS[k]) for k in keys]
    if "comm" in shown:
        handles.append(Patch(facecolor=COLORS["wait"], alpha=0.5, label=GANTT_LABELS["wait"]))
    ax.legend(handles=handles, ncol=len(handles), fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return fig


def _validation_html(val_dir: str) -> str:
    from xsim.replay.validate import Validation, validation_figure

    def csv(name: str) -> pl.DataFrame:
        p = os.path.join(val_dir, f"{name}.csv")
        if not os.path.isfile(p):
            raise ReportError(f"{val_dir}: no {name}.csv (pass the folder `xsim validate --out` wrote)")
        return pl.read_csv(p)

    v = Validation(csv("layers"), csv("classes"), csv("steps"))
    fmt = {"measured_ns": _fmt_ns, "simulated_ns": _fmt_ns, "error_pct": lambda x: f"{x:+.2f}%"}
    return (
        f"<p>Step-time error {v.step_error_pct():+.2f}% (from {html.escape(val_dir)}).</p>"
        + _svg(validation_figure(v))
        + "<h3>per op class</h3>"
        + _table(v.classes, fmt)
    )


def render_report(run: RunTables, validation_dir: str | None = None) -> str:
    """The report as one HTML string (inline CSS and SVG; nothing fetched at view time)."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("xsim report draws with matplotlib: pip install 'xsim-replay[plot]'") from None
    matplotlib.use("Agg")
    sections = [("Summary", _summary_html(run)), ("Per-rank time", _rank_time_html(run))]
    for key, title in (("layer", "Per layer"), ("phase", "Per phase")):
        df = op_time_by(run.ops, key)
        if df.height:
            fmt = {c: _fmt_ns for c in ("compute_ns", "comm_ns", "cpu_ns", "wait_sum_ns")}
            sections.append((title, _svg(_key_bars(df, key, key)) + _table(df, fmt)))
    top = _top_collectives_html(run)
    if top is not None:
        sections.append(("Top collectives by exposed time", top))
    picks = gantt_ranks(run)
    sections.append((f"Timeline of ranks {', '.join(map(str, picks))}", _svg(_gantt(run, picks))))
    if validation_dir:
        sections.append(("Validation against the real run", _validation_html(validation_dir)))
    body = "".join(f"<section><h2>{html.escape(t)}</h2>{c}</section>" for t, c in sections)
    title = report_title(run)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def _rank_time_html(run: RunTables) -> str:
    """The ranks table, then the same time as exclusive shares (bars and table)."""
    br = rank_breakdown(run.ops, len(run.ranks))
    ranks = run.ranks.sort("rank").select([c for c in RANK_COLUMNS if c in run.ranks.columns])
    shares = [share_column(c) for c in CATEGORIES]
    return (
        "<p>The ranks table (<code>ranks.csv</code>, docs/replay.md; the summary's totals and maxima are "
        "its columns summed and maximized): its columns overlap (compute and communication, waiting and "
        "bubble).</p>"
        + _table(ranks, {c: _fmt_ns for c in ranks.columns if c.endswith("_ns")})
        + "<p>The same time as exclusive shares (<code>*_share_ns</code>: each instant of a rank's "
        "[0, finish) counted once, first that applies): compute, CPU, exposed communication (active, "
        "nothing computing), wait (a collective waits for a late peer, nothing else runs), bubble "
        "(nothing runs inside the rank's compute span, waiting for a P2P recv included), idle (before "
        "the first or after the last compute). They sum to the finish time.</p>"
        + _svg(_stacked_bars(br))
        + _table(br, {c: _fmt_ns for c in (*shares, "finish_ns")})
    )


def _top_collectives_html(run: RunTables) -> str | None:
    """The collectives most exposed (active on a rank computing nothing); None without any."""
    exp = collective_exposure(run.ops)
    if not exp.height:
        return None
    top = (
        run.collectives.join(exp, on="collective", how="inner")
        .sort(["exposed_ns", "collective"], descending=[True, False])
        .head(TOP_COLLECTIVES)
        .select(
            "collective", "comm_type", "pg_name", "ranks", "bytes", "duration_ns", "exposed_ns", "wait_sum_ns"
        )
    )
    fmt = {"duration_ns": _fmt_ns, "exposed_ns": _fmt_ns, "wait_sum_ns": _fmt_ns, "bytes": _fmt_bytes}
    return (
        "<p>exposed = summed over the members, the time the collective was active on a rank while "
        "that rank computed nothing.</p>" + _table(top, fmt)
    )


def report_title(run: RunTables) -> str:
    """What was replayed, on what, and how long an iteration took (not the output folder's name)."""
    s = run.summary
    name = os.path.basename(run.source) if run.source else os.path.basename(os.path.abspath(run.directory))
    return (
        f"xsim report: {name}, {int(s['num_ranks']):,} ranks, {s['network_model']} network: "
        f"{_fmt_ns(s['iteration_time_ns'])} per iteration"
    )


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:1200px;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}td.num{text-align:right}"
    "table.kv th{background:#f4f4f4}svg{max-width:100%;height:auto}section{margin-bottom:2em}"
)


def write_report(
    result_dir: str | os.PathLike[str], out: str | os.PathLike[str], validation_dir: str | None = None
) -> str:
    """Render the report of a result folder and write it (temporary name, renamed into place)."""
    run = load_run(result_dir)
    if validation_dir is None and os.path.isfile(os.path.join(run.directory, "layers.csv")):
        validation_dir = run.directory
    try:
        text = render_report(run, validation_dir)
    except (KeyError, TypeError, ValueError, IndexError, pl.exceptions.PolarsError) as exc:
        # A table or summary that parses but lacks what a replay writes (a column, a key): one line,
        # naming the folder, not a traceback (issue 27 item 5).
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ReportError(
            f"{run.directory}: not a complete replay result ({type(exc).__name__}: {first}); rerun "
            f"`xsim replay --out`"
        ) from None
    read = ["ops.parquet", "ranks.parquet", "collectives.parquet", "summary.json", "cost.json", "source.json"]
    inputs = [os.path.join(run.directory, f) for f in read]
    if validation_dir:
        inputs += [os.path.join(validation_dir, f"{n}.csv") for n in ("layers", "classes", "steps")]
    return atomic_write_text(out, text, inputs)
