"""`xsim net collective|p2p`: time one collective or transfer on a network model, alone."""

from __future__ import annotations

import argparse
import json

from xsim.netmodels.api import COLLECTIVE_KINDS
from xsim.verbs import add_network_arguments, add_verb, network_options


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `net` verb and its sub-commands."""
    p = add_verb(
        sub,
        "net",
        help="look at a network model alone: time one collective or transfer",
        examples=(
            "xsim net collective --topology switch:8:50GBps:500ns --collective all_reduce --size 1MiB",
            "xsim net p2p --topology nodes:H100x8+A100x8 --src 0 --dst 8 --size 16MiB --model flow",
            "xsim net collective --topology switch:5:100Gbps:500ns --collective gather --algorithm direct "
            "--size 10MB --model ns3 --ns3-queue-packets 20   # incast: drops, retransmissions",
        ),
    )
    nsub = p.add_subparsers(dest="net_command", metavar="SUBCOMMAND", required=True)

    c = add_verb(
        nsub,
        "collective",
        help="per-rank finish times of one collective",
        description="Per-rank finish times of one collective. Exit status: 0 success; 2 bad input (unknown "
        "topology/algorithm, bad size, rank out of range, malformed ASTRA-sim config).",
        examples=(
            "xsim net collective --topology ring:8:50GBps:500ns --collective all_reduce --size 1MiB --json",
            "xsim net collective --astra-network network.yml --astra-system sys.json --collective all_gather "
            "--size 64MB",
        ),
    )
    _common(c)
    c.add_argument("--collective", required=True, choices=COLLECTIVE_KINDS, help="collective kind")
    c.add_argument(
        "--algorithm",
        help="ring, direct, halving_doubling, double_binary_tree (tree), hierarchical, multi_ring:K; on "
        "NCCL-mode clusters (dgx-a100, dgx-a800, dgx-h100) also ring/LL, ring/LL128, ring/Simple, tree/..., and on "
        "dgx-h100 NVLink SHARP: nvls (one node), nvls_tree (AllReduce across nodes), and pat "
        "(ReduceScatter/AllGather, one rank per node) "
        "(default: the model's, e.g. the ASTRA-sim system json's; NCCL's choice on NCCL-mode clusters)",
    )
    c.add_argument(
        "--ranks", help="process group, comma-separated global ranks or A-B ranges (default: all ranks)"
    )
    c.add_argument(
        "--root", type=int, help="root rank of broadcast/reduce/gather/scatter (default: first rank)"
    )
    c.set_defaults(func=_collective)

    t = add_verb(
        nsub,
        "p2p",
        help="finish time of one point-to-point transfer",
        examples=("xsim net p2p --topology switch:2:50GBps:1us --src 0 --dst 1 --size 1GiB",),
    )
    _common(t)
    t.add_argument("--src", type=int, required=True, help="source rank")
    t.add_argument("--dst", type=int, required=True, help="destination rank")
    t.set_defaults(func=_p2p)


def _common(p: argparse.ArgumentParser) -> None:
    add_network_arguments(p)
    p.add_argument(
        "--size", required=True, help="bytes, e.g. 1048576, 1MiB, 16MB (Chakra comm_size semantics)"
    )
    p.add_argument("--chunks", type=int, default=1, help="analytical/flow: chunks per collective (default 1)")
    p.add_argument(
        "--chunks-in-flight", type=int, default=1, help="analytical/flow: chunks in flight (default 1)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _model(args: argparse.Namespace):
    from xsim.api import build_network
    from xsim.netmodels.errors import NetworkModelError

    if not (args.topology or args.astra_network):
        raise NetworkModelError("give --topology SPEC (or --astra-network NETWORK.yml)")
    return build_network(network_options(args, chunks=args.chunks, chunks_in_flight=args.chunks_in_flight))


def _ranks(text: str | None, n: int) -> tuple[int, ...]:
    from xsim.netmodels.errors import NetworkModelError

    if not text:
        return tuple(range(n))
    out: list[int] = []
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        try:
            out.extend(range(int(a), int(b) + 1) if dash else [int(a)])
        except ValueError:
            raise NetworkModelError(f"cannot parse --ranks item {part!r} (use 0,1,2 or 0-7)") from None
    return tuple(out)


def _collective(args: argparse.Namespace) -> int:
    from xsim.netmodels.api import CollectiveSpec, simulate_collective
    from xsim.netmodels.units import parse_size

    model = _model(args)
    spec = CollectiveSpec(
        args.collective, parse_size(args.size), _ranks(args.ranks, model.num_ranks), args.algorithm, args.root
    )
    c = simulate_collective(model, spec)
    # NCCL mode: the algorithm and protocol NCCL's tuning model picked (or the ones forced).
    choice = getattr(model, "nccl_choice", None)
    ran = choice(spec) if choice is not None and getattr(model, "nccl", False) else None
    ran = None if ran is None else f"{'tree' if ran[0] == 'double_binary_tree' else ran[0]}/{ran[1]}"
    if args.json:
        print(
            json.dumps(
                {
                    "model": model.name,
                    "collective": spec.kind,
                    "algorithm": spec.algorithm,
                    "size_bytes": spec.size_bytes,
                    "ranks": list(spec.ranks),
                    "finish_ns": c.finish_ns,
                    "per_rank_finish_ns": list(c.per_rank_finish_ns),
                    **({"nccl": ran} if ran else {}),
                    **_ns3_stats(model),
                }
            )
        )
        return 0
    print(f"model {model.name}: {spec.kind} of {spec.size_bytes} bytes over {len(spec.ranks)} ranks")
    if ran:
        print(f"NCCL ran {ran}")
    for r, t in zip(spec.ranks, c.per_rank_finish_ns, strict=True):
        print(f"  rank {r:>5}  {t:>14} ns")
    print(f"finish {c.finish_ns} ns")
    _print_ns3_stats(model)
    return 0


def _ns3_stats(model) -> dict:
    """--model ns3: ns-3's own counters under the JSON key "ns3" (queue depth, drops, retransmissions)."""
    if getattr(model, "name", None) != "ns3":
        return {}
    from dataclasses import asdict

    return {"ns3": asdict(model.stats())}


def _print_ns3_stats(model) -> None:
    if getattr(model, "name", None) == "ns3":
        print(model.stats().line())


def _p2p(args: argparse.Namespace) -> int:
    from xsim.netmodels.api import simulate_p2p
    from xsim.netmodels.units import parse_size

    model = _model(args)
    c = simulate_p2p(model, args.src, args.dst, parse_size(args.size))
    if args.json:
        print(
            json.dumps(
                {
                    "model": model.name,
                    "src": args.src,
                    "dst": args.dst,
                    "finish_ns": c.finish_ns,
                    "per_rank_finish_ns": list(c.per_rank_finish_ns),
                    **_ns3_stats(model),
                }
            )
        )
    else:
        print(f"model {model.name}: {args.src} -> {args.dst}: finish {c.finish_ns} ns")
        _print_ns3_stats(model)
    return 0
