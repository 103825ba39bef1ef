"""Entry point of the `xsim` command: one sub-command module per verb, registered below.

Start-up stays light: the verb modules import only argparse and the network-model registry at module level;
everything heavy (polars, networkx, numpy, protobuf, rich) is imported by the verb that runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from xsim.verbs import HelpFormatter, Parser

# Each module defines `register(subparsers)` and sets `func(args) -> int` on its parsers. Adding a verb
# means adding its module here; the modules stay independent of each other.
COMMAND_MODULES: tuple[str, ...] = (
    "xsim.cmd_trace",
    "xsim.cmd_demo",
    "xsim.cmd_gen",
    "xsim.cmd_net",
    "xsim.cmd_replay",
    "xsim.cmd_plan",
    "xsim.cmd_rewrite",
    "xsim.cmd_import",
    "xsim.cmd_validate",
    "xsim.cmd_sweep",
    "xsim.cmd_report",
)

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


def version() -> str:
    """The source tree's version when xsim runs from one (its pyproject.toml), else the installed distribution's.

    The tree is read first: it is the code running (an editable install's metadata can name another
    checkout's version), and it spares `xsim --version` importlib.metadata's imports (email, zipfile: ~0.1 s).
    """
    import re
    from pathlib import Path

    try:
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        text = ""
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if m and re.search(r'^name\s*=\s*"xsim-replay"', text, re.M):
        return m.group(1)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("xsim-replay")  # the distribution name (pyproject.toml)
    except PackageNotFoundError:
        return m.group(1) if m else "unknown"


class _Version(argparse.Action):
    """--version, reading the version only when asked (importlib.metadata is slow to import)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, help="print xsim's version and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"xsim {version()}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the argument parser with every registered verb, or with verb `only` alone when it is one
    (`xsim replay ...` need not import and build the other ten verbs' parsers: start-up)."""
    parser = Parser(
        prog="xsim",
        description="Replay Chakra execution traces of distributed training on (heterogeneous) hardware.",
        epilog="examples:\n  xsim demo\n  xsim gen examples/figure1.yaml --out out/fig1\n"
        "  xsim replay out/fig1 --model flow --out out/fig1-result\n"
        "  xsim COMMAND --help",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = COMMAND_MODULES
    if only is not None and f"xsim.cmd_{only}" in COMMAND_MODULES:
        modules = (f"xsim.cmd_{only}",)  # module xsim.cmd_X registers the verb X
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `xsim` command line; returns the process exit code."""
    return _run(argv)[0]


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so `finally` blocks (staging folders, locks) run as for Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def entry() -> None:
    """The `xsim` command and `python -m xsim`: run the command line and end the process with its code."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    code, fast = _run(None)
    if code in (130, 143):
        # Interrupted: the one line is printed and every `finally` ran; end now, so no library's exit
        # hooks (Dask's, a thread pool's) print a traceback after it.
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(code)
    if fast:
        _exit_now(code)  # returns when the process must end the usual way
    sys.exit(code)


# jemalloc (polars' allocator, built with the `_rjem_` prefix) reads its options from this variable.
POLARS_MALLOC_ENV = "_RJEM_MALLOC_CONF"
POLARS_MALLOC_CONF = "background_thread:false"


def _run(argv: Sequence[str] | None) -> tuple[int, bool]:
    """The exit code, and whether the verb that ran lets the process end without interpreter teardown."""
    if "numpy" not in sys.modules:
        # OpenBLAS starts a thread per core (and its buffers) when numpy loads: 40-60 ms of an 8-rank
        # `xsim replay` on a 2-core machine (docs/performance.md, round 3c). No verb does BLAS work (no
        # matmul or linalg in the project), so one thread unless the caller chose otherwise.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if "polars" not in sys.modules:
        # polars' jemalloc starts background purging threads; where a thread's stack cannot be mapped (an
        # address-space limit near the run's size) it printed "background thread creation failed" without
        # end (3 GB of stderr in 13 minutes) and ignored SIGTERM, where the run otherwise finished or ended
        # in the one out-of-memory line (docs/performance.md, round 24w). Read when polars loads.
        os.environ.setdefault(POLARS_MALLOC_ENV, POLARS_MALLOC_CONF)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:
        # Alone, --version needs no parser (building it imports the verbs' option registries).
        print(f"xsim {version()}")
        raise SystemExit(EXIT_OK)  # as argparse's --version action
    parser = build_parser(only=argv[0] if argv else None)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # An unknown option belongs to the verb: print the verb's usage, not the top-level one.
        getattr(args, "verb_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT, False
    fast = bool(getattr(args, "fast_exit", False))
    from xsim.netmodels.errors import NetworkModelError
    from xsim.traces.errors import XsimError

    try:
        _check_output_paths(args)
        return int(args.func(args) or 0), fast
    except (XsimError, NetworkModelError) as exc:
        # Our own errors already name the file, rank and node; one line, no traceback.
        print(f"xsim: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT, fast
    except MemoryError:
        # Not a traceback (issue 24): how big the run was and what to try, found after the run's memory is
        # released with its frames.
        from xsim.oom import out_of_memory_line

        vp = getattr(args, "verb_parser", None)
        verb = vp.prog.split(" ", 1)[-1] if vp is not None else argv[0]
        print(f"xsim: error: {out_of_memory_line(verb, args)}", file=sys.stderr)
        return EXIT_BAD_INPUT, False
    except BrokenPipeError:
        return EXIT_OK, False
    except KeyboardInterrupt:
        print("xsim: interrupted", file=sys.stderr)
        return 130, False
    except Terminated:
        print("xsim: terminated", file=sys.stderr)
        return 143, False
    except OSError as exc:
        # An output (or input) the operating system refused: a full disk, a read-only file system, a
        # permission. Verbs name their files where they can; this is the net under them: one line.
        where = exc.filename if isinstance(exc.filename, str) else getattr(args, "command", "xsim")
        print(f"xsim: error: {where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT, False


# Options that name a file or folder a verb writes: refused in one line when not valid UTF-8 (the JSON
# and the "wrote ..." lines could not name them).
OUTPUT_OPTIONS = ("out", "timeline", "annotate", "plot")


def _check_output_paths(args: argparse.Namespace) -> None:
    values = [v for v in (getattr(args, name, None) for name in OUTPUT_OPTIONS) if isinstance(v, str)]
    if not values:
        return  # nothing to write: the output helpers need not load (start-up of a summary-only run)
    from xsim.traces.outputs import check_path_text

    for value in values:
        check_path_text(value)


def _exit_now(code: int) -> None:
    """End the process at once: atexit handlers run and the standard streams are flushed, but the
    interpreter is not torn down. After a replay, teardown (freeing every module, numpy's and protobuf's
    C state, a last collection) costs 50-100 ms CPU, a tenth of an 8-rank replay (docs/performance.md,
    round 4). Verbs opt in (`fast_exit`) only when they close every file they write before returning and
    start no thread or process. Returns (the caller exits the usual way) while a thread still runs, under
    a profiler or tracer, or when flushing fails."""
    import atexit

    threading = sys.modules.get("threading")
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # CPython's own exit path calls it too
    if run_exitfuncs is None or (threading is not None and threading.active_count() > 1):
        return
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return  # a profiler or tracer (pyinstrument, cProfile, coverage) writes its report after main returns
    run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # e.g. a closed pipe: the interpreter's own exit reports it as usual
    os._exit(code)
