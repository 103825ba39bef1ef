"""What every verb's parser shares: examples in an epilog, defaults shown, errors in the verb's own usage."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn


class HelpFormatter(argparse.HelpFormatter):
    """Wraps the description as usual, but prints the examples epilog line by line, as written."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        if width is None:
            # argparse would import shutil (and with it zlib, bz2 and lzma) for the terminal's width: the
            # same width from os, as shutil.get_terminal_size() finds it, less argparse's margin of 2.
            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: the verb, the error, a "did you mean" when a close
    option or choice exists, and where the usage is (issue 26 item 9: a 10-line usage before the error)."""

    def error(self, message: str) -> NoReturn:
        """Print one line and exit with status 2."""
        hint = _did_you_mean(self, message)
        self.exit(2, f"{self.prog}: error: {message}{hint}; see `{self.prog} --help`\n")


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """ " (did you mean X?)" for an unknown option or an invalid choice close to a known one, else ""."""
    import difflib
    import re

    if message.startswith("unrecognized arguments:"):
        known = [o for a in parser._actions for o in a.option_strings]
        wrong = [w for w in message.split(":", 1)[1].split() if w.startswith("-")]
        pairs = [(w, difflib.get_close_matches(w.split("=", 1)[0], known, n=1)) for w in wrong]
        close = [f"{m[0]} for {w}" if len(pairs) > 1 else m[0] for w, m in pairs if m]
        return f" (did you mean {', '.join(close)}?)" if close else ""
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:
        choices = re.findall(r"'([^']*)'", m.group(2)) or [c.strip() for c in m.group(2).split(",")]
        close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
        return f" (did you mean {close[0]}?)" if close else ""
    return ""


def terminal_columns() -> int:
    """The terminal's width as shutil.get_terminal_size() gives it: $COLUMNS when a positive integer, else
    the width of the terminal on standard output, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def add_verb(
    subparsers: argparse._SubParsersAction,
    name: str,
    *,
    help: str,
    description: str | None = None,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """A sub-command parser whose --help ends with runnable examples; its errors print its own usage."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None
    p = subparsers.add_parser(
        name,
        help=help,
        description=description or help,
        epilog=epilog,
        formatter_class=HelpFormatter,
    )
    p.set_defaults(verb_parser=p)
    return p


def lazy_help(template: str, module: str, attr: str) -> type[argparse.Action]:
    """A store action whose help is `template` formatted with `module.attr`, imported only when --help
    is printed (e.g. the topology grammar, which lives beside networkx)."""

    class LazyHelpStore(argparse._StoreAction):
        @property
        def help(self) -> str:
            import importlib

            return template.format(getattr(importlib.import_module(module), attr))

        @help.setter
        def help(self, value: str | None) -> None:
            pass

    return LazyHelpStore


def add_network_arguments(group) -> None:
    """The network flags every verb that builds a network model shares, with one meaning everywhere."""
    from xsim.netmodels.models import model_choices

    group.add_argument(
        "--model",
        choices=model_choices(),
        help="network model (default: analytical, or astra-unaware with --astra-network); analytical is "
        "contention-free: concurrent transfers never share a link (an all-to-all on a ring runs ~10x faster "
        "than under flow, which shares links max-min fairly); to run analytical/flow on an ASTRA-sim "
        "network, pass --topology astra:NETWORK.yml",
    )
    group.add_argument(
        "--topology",
        metavar="SPEC",
        action=lazy_help("topology spec: {}", "xsim.netmodels.cluster", "SPEC_HELP"),
        help="",
    )
    group.add_argument(
        "--astra-network", metavar="NET.yml", help="ASTRA-sim network config (compatible mode)"
    )
    group.add_argument(
        "--astra-system", metavar="SYS.json", help="ASTRA-sim system config (with --astra-network)"
    )
    group.add_argument(
        "--congestion-aware",
        action="store_true",
        help="ASTRA-sim's congestion-aware backend (1-D only; = --model astra-aware)",
    )
    add_ns3_arguments(group)


def add_ns3_arguments(group) -> None:
    """The `--ns3-*` flags: how `--model ns3` runs its packets (defaults: netmodels/ns3_defaults.py)."""
    from xsim.netmodels import ns3_defaults as o

    group.add_argument(
        "--ns3-tcp",
        choices=tuple(o.TCP_VARIANTS),
        help=f"--model ns3: TCP congestion control (default: {o.DEFAULT_TCP}; dctcp needs --ns3-queue red)",
    )
    group.add_argument(
        "--ns3-queue",
        choices=tuple(o.QUEUE_DISCS),
        help=f"--model ns3: queue discipline of every device (default: {o.DEFAULT_QUEUE}, drop-tail)",
    )
    group.add_argument(
        "--ns3-queue-packets",
        type=int,
        metavar="N",
        help=f"--model ns3: each queue's capacity in packets (default: {o.DEFAULT_QUEUE_PACKETS:,})",
    )
    group.add_argument(
        "--ns3-max-packets",
        type=int,
        metavar="N",
        help=f"--model ns3: per-run limit on data packets; a run needing more stops with one line "
        f"(default: {o.DEFAULT_MAX_PACKETS:,})",
    )
    group.add_argument(
        "--ns3-min-rto",
        metavar="TIME",
        help=f"--model ns3: TCP's minimum retransmission timeout, e.g. 200us "
        f"(default: {o.DEFAULT_MIN_RTO_NS // 10**9} s, ns-3's)",
    )
    group.add_argument(
        "--ns3-no-ecmp",
        action="store_true",
        help="--model ns3: one route per destination instead of spreading packets over equal-cost paths",
    )


def network_options(args: argparse.Namespace, **extra):
    """The API's NetworkOptions from the flags `add_network_arguments` added (plus verb-specific ones)."""
    from xsim.api import NetworkOptions

    return NetworkOptions(
        model=args.model,
        topology=args.topology,
        astra_network=args.astra_network,
        astra_system=args.astra_system,
        congestion_aware=args.congestion_aware,
        ns3=ns3_options(args),
        **extra,
    )


def ns3_options(args: argparse.Namespace):
    """The `--ns3-*` flags as Ns3Options, None when none was given (an unknown value: one error line)."""
    given = {
        "tcp": args.ns3_tcp,
        "queue": args.ns3_queue,
        "queue_packets": args.ns3_queue_packets,
        "max_packets": args.ns3_max_packets,
        "min_rto_ns": args.ns3_min_rto,
        "ecmp": False if args.ns3_no_ecmp else None,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    from xsim.netmodels.ns3_options import Ns3Options

    if "min_rto_ns" in given:
        from xsim.netmodels.units import parse_time_ns

        rto = parse_time_ns(given["min_rto_ns"])
        if rto != int(rto):
            from xsim.netmodels.errors import NetworkModelError

            raise NetworkModelError(f"--ns3-min-rto must be whole nanoseconds, got {given['min_rto_ns']!r}")
        given["min_rto_ns"] = int(rto)
    return Ns3Options(**given)


GPU_FILE_HELP = (
    "hypothetical GPUs: a YAML/TOML/JSON file of NAME: {peak_flops, mem_bw, memory_bytes, fp8_flops, sms, "
    "nvlink_bandwidth, nic_bandwidth, nics, calibrated_as, price_per_hour} usable wherever a catalog GPU "
    "name is (docs/tracegen.md, 'Hypothetical GPUs')"
)


def add_gpu_file_argument(p) -> None:
    """The --gpu-file option (user-defined GPUs, tracegen.spec.read_gpu_file)."""
    p.add_argument("--gpu-file", metavar="PATH", help=GPU_FILE_HELP)
