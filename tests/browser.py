"""Headless Chromium and the offline speedscope viewer, for the tests and scripts that render xsim outputs.

Both come from the registries (`.ci/run` installs them): Chromium from Debian's `chromium` package, and
speedscope from npm into `.ci/node_modules` (or the folder `XSIM_SPEEDSCOPE` names). Every helper returns
None (with the reason in `missing()`) when one is absent, so tests skip with a clear reason.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEEDSCOPE_VERSION = "1.25.0"  # pinned in .ci/run
# Flags for a quiet, offline, throw-away browser: no sandbox (root in CI), no GPU, nothing fetched.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--disable-default-apps",
)


def chromium() -> str | None:
    """Path of a Chromium binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def speedscope_dir() -> Path | None:
    """speedscope's built viewer (dist/release with index.html), or None."""
    env = os.environ.get("XSIM_SPEEDSCOPE")
    for base in ([Path(env)] if env else []) + [REPO / ".ci" / "node_modules" / "speedscope"]:
        d = base / "dist" / "release"
        if (d / "index.html").is_file():
            return d
    return None


def missing(need_speedscope: bool = False) -> str | None:
    """Why a browser check cannot run here, or None when it can."""
    if chromium() is None:
        return "chromium not installed (apt-get install chromium; .ci/run does)"
    if need_speedscope and speedscope_dir() is None:
        return f"speedscope not installed (npm install --prefix .ci speedscope@{SPEEDSCOPE_VERSION}; .ci/run does)"
    return None


def run_chromium(url: str, screenshot: Path | None = None, size: str = "1400,900", dump_dom: bool = False):
    """Load `url` in a fresh headless profile; returns the CompletedProcess (stderr holds console output)."""
    exe = chromium()
    assert exe is not None
    with tempfile.TemporaryDirectory(prefix="xsim-chromium-") as profile:
        cmd = [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size}",
            "--virtual-time-budget=15000",
            "--enable-logging=stderr",
            "--v=0",
        ]
        if screenshot is not None:
            cmd.append(f"--screenshot={screenshot}")
        if dump_dom:
            cmd.append("--dump-dom")
        cmd.append(url)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def console_errors(stderr: str) -> list[str]:
    """Lines of Chromium's log that are page console errors or uncaught exceptions."""
    out = []
    for line in stderr.splitlines():
        if "CONSOLE" in line and ("ERROR" in line or "Uncaught" in line):
            out.append(line)
        elif "Uncaught" in line:
            out.append(line)
    return out


def render_speedscope(profile: Path, screenshot: Path, size: str = "1400,900", view: str = "time-ordered"):
    """Screenshot speedscope showing `profile` (loaded offline through its localProfilePath hook)."""
    d = speedscope_dir()
    assert d is not None
    with tempfile.TemporaryDirectory(prefix="xsim-speedscope-") as tmp:
        js = Path(tmp) / "profile.js"
        b64 = base64.b64encode(profile.read_bytes()).decode("ascii")
        js.write_text(f"speedscope.loadFileFromBase64({profile.name!r}, {b64!r})\n", encoding="utf-8")
        # view: speedscope's hash parameter (time-ordered, left-heavy, sandwich).
        return run_chromium(
            f"{(d / 'index.html').as_uri()}#localProfilePath={js}&view={view}", screenshot, size
        )


def png_pixels(path: Path):
    """RGB array (height, width, 3) of a PNG, through matplotlib; None without it."""
    try:
        import matplotlib.image as mpimg
    except ImportError:
        return None
    img = mpimg.imread(str(path))
    return img[:, :, :3]
