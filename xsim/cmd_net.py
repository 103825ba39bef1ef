"""`xsim net collective|p2p`: time one collective or transfer on a network model, alone."""

from __future__ import annotations

import argparse
import json

from netmodels import (
    COLLECTIVE_KINDS,
    CollectiveSpec,
    NetworkModel,
    NetworkModelError,
    astra_model,
    build_model,
    simulate_collective,
    simulate_p2p,
    topology_from_spec,
)
from netmodels.astra import load_network_yml
from netmodels.cluster import SPEC_HELP
from netmodels.topology import multi_dim_topology
from netmodels.units import parse_size


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `net` verb and its sub-commands."""
    p = sub.add_parser("net", help="look at a network model alone: time one collective or transfer")
    nsub = p.add_subparsers(dest="net_command", metavar="SUBCOMMAND", required=True)

    c = nsub.add_parser(
        "collective",
        help="per-rank finish times of one collective",
        description="Exit status: 0 success; 2 bad input (unknown topology/algorithm, bad size, rank out of range, "
        "malformed ASTRA-sim config).",
    )
    _common(c)
    c.add_argument("--collective", required=True, choices=COLLECTIVE_KINDS, help="collective kind")
    c.add_argument(
        "--algorithm",
        help="ring, direct, halving_doubling, double_binary_tree, hierarchical, multi_ring:K "
        "(default: the model's, e.g. the ASTRA-sim system json's)",
    )
    c.add_argument(
        "--ranks", help="process group, comma-separated global ranks or A-B ranges (default: all ranks)"
    )
    c.add_argument(
        "--root", type=int, help="root rank of broadcast/reduce/gather/scatter (default: first rank)"
    )
    c.set_defaults(func=_collective)

    t = nsub.add_parser("p2p", help="finish time of one point-to-point transfer")
    _common(t)
    t.add_argument("--src", type=int, required=True, help="source rank")
    t.add_argument("--dst", type=int, required=True, help="destination rank")
    t.set_defaults(func=_p2p)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", help=f"topology spec: {SPEC_HELP}")
    p.add_argument(
        "--size", required=True, help="bytes, e.g. 1048576, 1MiB, 16MB (Chakra comm_size semantics)"
    )
    p.add_argument(
        "--model",
        choices=("analytical", "flow", "astra"),
        help="network model (default: analytical, or astra when --astra-network is given)",
    )
    p.add_argument("--astra-network", metavar="YML", help="ASTRA-sim network config (network.yml)")
    p.add_argument(
        "--astra-system", metavar="JSON", help="ASTRA-sim system config (sys.json); default: clean profile"
    )
    p.add_argument(
        "--congestion-aware", action="store_true", help="ASTRA-sim mode: the congestion-aware backend"
    )
    p.add_argument("--chunks", type=int, default=1, help="analytical/flow: chunks per collective (default 1)")
    p.add_argument(
        "--chunks-in-flight", type=int, default=1, help="analytical/flow: chunks in flight (default 1)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _model(args: argparse.Namespace) -> NetworkModel:
    name = args.model or ("astra" if args.astra_network else "analytical")
    if name == "astra":
        if not args.astra_network:
            raise NetworkModelError("--model astra needs --astra-network NETWORK.yml")
        return astra_model(args.astra_network, args.astra_system, args.congestion_aware)
    if args.topology:
        topo = topology_from_spec(args.topology)
    elif args.astra_network:
        net = load_network_yml(args.astra_network)
        topo = multi_dim_topology(
            (d.topology_kind, d.npus, d.bytes_per_ns * 1e9, d.latency_ns) for d in net.dims
        )
    else:
        raise NetworkModelError("give --topology SPEC (or --astra-network NETWORK.yml)")
    return build_model(name, topo, chunks=args.chunks, chunks_in_flight=args.chunks_in_flight)


def _ranks(text: str | None, n: int) -> tuple[int, ...]:
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
    model = _model(args)
    spec = CollectiveSpec(
        args.collective, parse_size(args.size), _ranks(args.ranks, model.num_ranks), args.algorithm, args.root
    )
    c = simulate_collective(model, spec)
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
                }
            )
        )
        return 0
    print(f"model {model.name}: {spec.kind} of {spec.size_bytes} bytes over {len(spec.ranks)} ranks")
    for r, t in zip(spec.ranks, c.per_rank_finish_ns, strict=True):
        print(f"  rank {r:>5}  {t:>14} ns")
    print(f"finish {c.finish_ns} ns")
    return 0


def _p2p(args: argparse.Namespace) -> int:
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
                }
            )
        )
    else:
        print(f"model {model.name}: {args.src} -> {args.dst}: finish {c.finish_ns} ns")
    return 0
