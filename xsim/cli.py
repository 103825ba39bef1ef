"""Entry point of the `xsim` command: one sub-command module per verb, registered below."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from netmodels.errors import NetworkModelError
from traces.errors import XsimError

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


def build_parser() -> argparse.ArgumentParser:
    """Build the full argument parser with every registered verb."""
    parser = argparse.ArgumentParser(
        prog="xsim",
        description="Replay Chakra execution traces of distributed training on (heterogeneous) hardware.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `xsim` command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args) or 0)
    except (XsimError, NetworkModelError) as exc:
        # Our own errors already name the file, rank and node; one line, no traceback.
        print(f"xsim: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        print("xsim: interrupted", file=sys.stderr)
        return 130
