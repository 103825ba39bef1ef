"""Render the screenshots in docs/img/ with real viewers: the Figure 1 replay in speedscope (its own format,
Left Heavy over all ranks: op kinds by summed time), the HTML report in headless Chromium, plus the
validation figure of the bundled 2-rank PyTorch run and the Pareto plot of the bundled sweep
(examples/decide/sweep_a100_h100.yaml, `xsim sweep`'s own PNG).

Needs Chromium and speedscope (`.ci/run` installs both; see tests/browser.py). Run from the repository root:
    python scripts/render_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import browser  # noqa: E402
from xsim.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EX = REPO / "traces" / "examples" / "pytorch"


def _run(argv: list[str]) -> None:
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"xsim {' '.join(argv)}: exit {rc}")


def render(out: Path) -> list[Path]:
    """Generate, replay and render; returns the images written."""
    why = browser.missing(need_speedscope=True)
    if why:
        raise SystemExit(why)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory(prefix="xsim-shots-") as tmp:
        t = Path(tmp)
        _run(["gen", str(REPO / "examples" / "figure1.yaml"), "--out", str(t / "fig1")])
        _run(
            [
                "replay",
                str(t / "fig1"),
                "--out",
                str(t / "res"),
                "--timeline",
                str(t / "timeline.speedscope.json"),
                "--no-progress",
            ]
        )
        browser.render_speedscope(
            t / "timeline.speedscope.json",
            out / "timeline-speedscope.png",
            size="1400,420",
            view="left-heavy",
        )
        made.append(out / "timeline-speedscope.png")
        ets = [str(EX / f"tinygpt_2rank_et.{r}.json.gz") for r in range(2)]
        kin = [str(EX / f"tinygpt_2rank_kineto.{r}.json.gz") for r in range(2)]
        _run(["import", "pytorch", "--et", *ets, "--kineto", *kin, "--out", str(t / "ddp" / "run")])
        _run(
            [
                "replay",
                str(t / "ddp" / "run"),
                "--comm",
                "measured",
                "--out",
                str(t / "ddp" / "res"),
                "--no-progress",
            ]
        )
        _run(["validate", "--real", *kin, "--sim", str(t / "ddp" / "res"), "--out", str(t / "ddp" / "val")])
        shutil.copy(t / "ddp" / "val" / "validation.png", out / "validation.png")
        made.append(out / "validation.png")
        _run(["report", str(t / "res"), "--out", str(t / "report.html")])
        r = browser.run_chromium((t / "report.html").as_uri(), out / "report.png", size="1280,1500")
        errors = browser.console_errors(r.stderr)
        if r.returncode or errors:
            raise SystemExit(f"chromium: exit {r.returncode}, console errors {errors}")
        made.append(out / "report.png")
    made.append(render_pareto(out))
    return made


def render_pareto(out: Path) -> Path:
    """The bundled sweep's Pareto plot (tokens/s against $/Mtok, identical results merged and labelled)."""
    with tempfile.TemporaryDirectory(prefix="xsim-sweep-") as tmp:
        sweep = REPO / "examples" / "decide" / "sweep_a100_h100.yaml"
        _run(["sweep", str(sweep), "--out", str(Path(tmp) / "sweep"), "--workers", "1"])
        shutil.copy(Path(tmp) / "sweep" / "pareto.png", out / "sweep-pareto.png")
    return out / "sweep-pareto.png"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "img"), help="folder for the PNGs")
    ap.add_argument(
        "--only-pareto", action="store_true", help="only the sweep's Pareto plot (no browser needed)"
    )
    args = ap.parse_args()
    for p in [render_pareto(Path(args.out))] if args.only_pareto else render(Path(args.out)):
        print(p)
