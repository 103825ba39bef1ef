"""`xsim plan SPEC [--json]`: DP groups, multi-rings, chunks, barrier groups and memory of a deployment.

`xsim plan --search CLUSTER --model M --global-batch B`: propose plans for a cluster (xsim/explore/search.py).
"""

from __future__ import annotations

import argparse
import json

from xsim.verbs import add_gpu_file_argument, add_verb


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` verb."""
    p = add_verb(
        subparsers,
        "plan",
        help="show the heterogeneity-aware plan (DP groups, rings, chunks, barrier groups, memory) of a spec, "
        "or search plans for a cluster",
        description="Run the planner (sweep-line DP groups, LCM multi-rings and chunking, barrier groups, "
        "pipeline boundaries) on a deployment spec and print it with each rank's memory; a plan that does "
        "not fit in GPU memory is refused (--allow-oom to go on). With --search, propose plans for a cluster "
        "instead (docs/decide.md).",
        examples=(
            "xsim plan examples/figure1.yaml",
            "xsim plan examples/figure1_paper.yaml --json --allow-oom  # the paper's plan as drawn: over memory",
            "xsim plan --search 4xH100+4xA100-40GB --model llama2-7b --global-batch 16 --seq 2048 --top 3",
        ),
    )
    p.add_argument("spec", nargs="?", help="deployment spec (.yaml, .yml, .toml or .json)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (keys in docs/planner.md)")
    p.add_argument("--allow-oom", action="store_true", help="go on when a rank does not fit in GPU memory")
    s = p.add_argument_group("search (docs/decide.md)")
    s.add_argument("--search", metavar="CLUSTER", help="GPU mix to plan for, e.g. 4xH100+4xA100-40GB")
    s.add_argument("--model", dest="search_model", metavar="M", help="model preset (llama2-7b, ...)")
    s.add_argument("--global-batch", type=int, metavar="B", help="sequences per iteration")
    s.add_argument("--seq", type=int, metavar="S", help="sequence length (default: the model's context)")
    s.add_argument("--top", type=int, default=3, metavar="K", help="plans verified by full replay (3)")
    s.add_argument("--out", default="out/search", metavar="DIR", help="spec files and replays (out/search)")
    s.add_argument("--workers", type=int, default=2, help="Dask workers of the embedded cluster (2)")
    s.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler instead")
    add_gpu_file_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print (or search)."""
    from xsim import api
    from xsim.tracegen.errors import SpecError
    from xsim.tracegen.memory import check_fits, deployment_memory, format_memory, memory_json
    from xsim.tracegen.planner import build_plan, format_plan, plan_to_json

    if args.search:
        from xsim.explore.search import SearchRequest, format_search, search

        if args.spec:
            # A search plans for a cluster from scratch: a SPEC beside it would be silently ignored.
            raise SpecError(
                f"plan: give a SPEC or --search CLUSTER, not both (--search ignores {args.spec}; "
                "`xsim plan SPEC` shows that spec's plan)"
            )

        if not args.search_model or not args.global_batch:
            raise SpecError("plan --search needs --model M and --global-batch B")
        res = search(
            SearchRequest(
                args.search, args.search_model, args.global_batch, seq=args.seq, top=args.top, out=args.out,
                workers=args.workers, scheduler=args.scheduler, progress=not args.json, gpu_file=args.gpu_file,
            )
        )  # fmt: skip
        print(format_search(res))
        return 0
    if not args.spec:
        raise SpecError("plan: give a SPEC, or --search CLUSTER --model M --global-batch B")
    dep = api.load_spec(args.spec, gpu_file=args.gpu_file)
    plan = build_plan(dep)
    mem = deployment_memory(dep)
    if not args.allow_oom:
        check_fits(mem, args.spec, dep)
    if args.json:
        print(json.dumps({**plan_to_json(plan), "memory": memory_json(mem)}, indent=2))
    else:
        print(format_plan(plan))
        print("memory per rank (tracegen/memory.py):")
        print(format_memory(mem))
        from xsim.tracegen.spec import gpu_notes

        for line in gpu_notes(dep):  # what hypothetical GPUs borrow from a known architecture
            print(f"note: {line}")
    return 0
