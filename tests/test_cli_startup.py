"""Start-up of `xsim replay` (issue 11 item 4): a summary-only replay loads neither polars, networkx nor
PyYAML, the polars tables appear on first access, and the light topology graph orders nodes, links and
routes exactly as networkx.DiGraph does. No timing here (scripts/bench_startup.py measures)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import networkx as nx
import pytest
from xsim.netmodels.cluster import topology_from_spec
from xsim.netmodels.digraph import DiGraph

from tests.conftest import need_shared
from xsim import api

REPO = Path(__file__).resolve().parents[1]
# numpy.ma: np.unique without return_* imports it (~30 ms); the replay path dedupes by hand instead.
LAZY = ("polars", "networkx", "yaml", "rich", "matplotlib", "numpy.ma")
# Reading deployment.json and memory.json needs neither the op cost model, the reshard strategies, the
# profile reader, the memory model nor a TOML parser (tracegen/choices.py, tracegen/memory_summary.py).
LAZY += (
    "xsim.tracegen.ops",
    "xsim.tracegen.planner.reshard",
    "xsim.tracegen.profile",
    "xsim.tracegen.memory",
    "tomllib",
)
# Writing outputs (tempfile) and JSON traces (protobuf's json_format) load on first use only.
LAZY += ("tempfile", "google.protobuf.json_format")
# Round 4: argparse's terminal width without shutil (and its zlib siblings bz2, lzma), no pathlib (with
# urllib.parse) for reading a deployment's cluster, and xsim.api's generation side not loaded by a replay.
# setuptools' default editable install imports pathlib before any of our code: the subprocesses below
# drop these from sys.modules first, so that a module of ours importing them again shows.
CUT = ("shutil", "bz2", "lzma", "pathlib", "urllib.parse", "xsim.api.generation")
LAZY += CUT
# Issue 30 round 6: what only a rare branch or a writer needs loads there: the deadlock explainer (a stuck
# run), the protobuf-message columns (sets the columnar decoder leaves), the folded ops.csv text writer
# (writing tables) and gzip (writing .gz, JSON views; reading .et.gz inflates with zlib, traces/limits.py).
LAZY += (
    "xsim.replay.deadlock",
    "xsim.traces.node_columns",
    "xsim.replay.ops_text",
    "gzip",
    "xsim.netmodels.ns3_options",  # the --ns3-* flags' choices and defaults: netmodels/ns3_defaults.py
)
# An ASTRA-sim-mode replay builds no topology graph, writes nothing and is no what-if: neither the graph, the
# output helpers nor the what-if helpers load (a generated set's deployment reader, tracegen.spec, needs the
# output helpers; its GPU types, the what-if module).
ASTRA_LAZY = ("xsim.netmodels.topology", "xsim.netmodels.digraph", "xsim.traces.outputs", "xsim.api.whatif")


def _replay_in_subprocess(argv: list[str]) -> tuple[str, set[str]]:
    """stdout of `xsim ARGV` run in a fresh interpreter, and the modules it had loaded by the end."""
    code = (
        "import sys, contextlib, io, json\n"
        f"for m in {CUT!r}: sys.modules.pop(m, None)\n"
        "from xsim.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n"
        f"        rc = main({argv!r})\n"
        "    except SystemExit as exc:\n"
        "        rc = exc.code\n"
        "print(json.dumps({'rc': rc, 'out': buf.getvalue(), 'modules': sorted(sys.modules)}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["rc"] == 0, res.stderr
    return obj["out"], set(obj["modules"])


@pytest.fixture(scope="module")
def c01(tmp_path_factory) -> Path:
    """The paper's Table 4 C01 (2 ranks, H100) generated once, with its deployment.json."""
    out = tmp_path_factory.mktemp("c01") / "set"
    api.generate(REPO / "examples" / "table4_c01.yaml", api.GenerateOptions(out=str(out)))
    return out


def test_summary_replay_of_generated_set_loads_no_heavy_library(c01: Path) -> None:
    out, loaded = _replay_in_subprocess(["replay", str(c01), "--no-progress"])
    assert [m for m in LAZY if m in loaded] == []
    # The printed numbers are the tables' (built here, with polars, from an in-process replay).
    res = api.simulate(c01).result
    it = int(res.summary["iteration_time_ns"][0])
    assert f"iteration time     {it:,} ns" in out
    assert f"in {int(res.summary['num_collectives'][0]):,} collectives" in out


def _astra_peer_argv(case: str) -> list[str]:
    """`xsim replay` of an 8-NPU peer trace set in ASTRA-sim mode, as scripts/bench_startup.py times it."""
    et, cfg = need_shared("peer_traces", "chakra_et"), need_shared("peer_configs", "astra-sim")
    if case == "all_reduce":
        path = et / "astra-sim_microbenchmarks" / "all_reduce" / "8npus_1MB"
        net, sys_ = (
            cfg / "network" / "repo_examples_Ring_8npus.yml",
            cfg / "system" / "repo_examples_Ring_4chunks.json",
        )
        extra: list[str] = []
    else:
        t3d = et / "astra-sim-artifacts_T3D-analytical"
        path, net, sys_ = t3d / "trace", t3d / "inputs" / "network.yml", t3d / "inputs" / "sys.json"
        extra = ["--comm-groups", str(t3d / "inputs" / "comm_group.json")]
    return [
        "replay",
        str(path),
        "--astra-network",
        str(net),
        "--astra-system",
        str(sys_),
        *extra,
        "--no-progress",
    ]


@pytest.mark.parametrize("case", ["all_reduce", "t3d"])
def test_astra_mode_replay_of_8_npu_peer_traces_loads_only_its_path(case: str) -> None:
    # all_reduce folds (one of 8 ranks simulated, the tables expanded); T3D's groups refuse the fold.
    argv = _astra_peer_argv(case)
    out, loaded = _replay_in_subprocess(argv)
    assert [m for m in (*LAZY, *ASTRA_LAZY) if m in loaded] == []
    opts = api.ReplayOptions(
        network=api.NetworkOptions(astra_network=argv[3], astra_system=argv[5]),
        compute=api.ComputeOptions(astra_system=argv[5]),
        comm_groups=argv[7] if case == "t3d" else None,
        progress=False,
    )
    res = api.simulate(argv[1], opts).result
    assert f"iteration time     {int(res.summary['iteration_time_ns'][0]):,} ns" in out
    assert res.fold_status == ("folded" if case == "all_reduce" else "unfolded")
    assert f"{'folded' if case == 'all_reduce' else 'not folded'}  " in out


def test_records_of_arrays_generate_no_eq_hash_or_repr() -> None:
    # Each generated dataclass method is a compile when its module loads (~0.1 ms of every replay); on
    # records of numpy arrays __eq__ / __hash__ could only raise and nothing prints them (round 6).
    from xsim.replay import build, fold, fold_bytes, ops_text, rank_view, result
    from xsim.traces import columnar, wire

    records = [getattr(columnar, n) for n in ("AttrColumn", "RankColumns", "_Bytes", "_Units", "_Framed")]
    records += [getattr(columnar, n) for n in ("_Nodes", "_Fields", "_AttrFields", "_Walk", "_Regions")]
    records += [columnar._Inner, columnar._AttrTable, wire._SpanKeys, result.OpsColumns, rank_view.RankView]
    records += [
        fold_bytes.Template,
        fold_bytes.Prediction,
        fold_bytes._Layout,
        fold._RepTemplate,
        fold.RepFile,
    ]
    records += [build._Edges, build._Deps, build._Nodes, ops_text.ChunkRows]
    for cls in records:
        assert [m for m in ("__eq__", "__repr__") if m in vars(cls)] == [], cls
        assert cls.__hash__ is object.__hash__, cls  # identity: a generated hash of arrays would raise


def test_help_loads_neither_numpy_nor_protobuf_nor_the_api() -> None:
    out, loaded = _replay_in_subprocess(["--help"])
    assert "replay" in out and "COMMAND" in out
    # The verbs' choices come from import-free registries (netmodels.models, tracegen.choices).
    heavy = (
        "numpy",
        "google.protobuf",
        "xsim.traces.pb",
        "xsim.api",
        "xsim.replay",
        "xsim.tracegen.planner",
        *LAZY,
    )
    assert [m for m in heavy if m in loaded] == []


def test_version_alone_builds_no_parser_and_reads_no_distribution_metadata() -> None:
    # Issue 30 item 4: `xsim --version` printed after importing every verb's registries and
    # importlib.metadata (email, zipfile); run from the source tree it reads pyproject.toml alone.
    out, loaded = _replay_in_subprocess(["--version"])
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    version = next(line.split('"')[1] for line in text.splitlines() if line.startswith("version ="))
    assert out == f"xsim {version}\n"
    heavy = (
        "importlib.metadata",
        "xsim.netmodels.models",
        "xsim.netmodels.api",
        "xsim.tracegen.choices",
        "numpy",
    )
    assert [m for m in heavy if m in loaded] == []


def test_help_width_is_the_terminal_width_shutil_reports(monkeypatch) -> None:
    from xsim.verbs import terminal_columns

    for value in ("57", "0", "-3", "wide", None):
        if value is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", value)
        assert terminal_columns() == shutil.get_terminal_size().columns
    # The width reaches argparse: the description wraps at the width less argparse's margin of 2.
    for columns, lo, hi in (("57", 40, 55), ("200", 100, 198)):
        code = "from xsim.cli import main\nmain(['replay', '--help'])\n"
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": columns}
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
        assert res.returncode == 0, res.stderr
        first = next(ln for ln in res.stdout.splitlines() if ln.startswith("Replay every node"))
        assert lo < len(first) <= hi


def test_spec_choices_equal_their_registries() -> None:
    # spec.py checks deployment.json against tracegen/choices.py, which imports no registry: same names.
    from xsim.tracegen import choices, ops
    from xsim.tracegen.planner.reshard import STRATEGIES

    assert choices.RESHARD_STRATEGIES == tuple(STRATEGIES)
    assert (ops.PRECISIONS, ops.ATTENTIONS, ops.COMPUTE_MODELS) == (
        choices.PRECISIONS,
        choices.ATTENTIONS,
        choices.COMPUTE_MODELS,
    )


def test_tables_built_on_first_access(c01: Path) -> None:
    code = (
        "import sys\n"
        "from xsim import api\n"
        f"run = api.simulate({str(c01)!r})\n"
        "s = run.result.summary_dict()\n"
        "before = 'polars' in sys.modules\n"
        "n = run.result.ops.height\n"
        "print(before, 'polars' in sys.modules, n == s['num_nodes'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True", "True"]


def test_pipeline_summary_from_columns_equals_tables() -> None:
    # tiny_pipeline: 4 ranks, 2 stages with P2P; two ranks wait for a late peer (hand-made set).
    argv = ["replay", "traces/examples/tiny_pipeline", "--topology", "ring:4:50GBps:500ns", "--no-progress"]
    out, loaded = _replay_in_subprocess(argv)
    assert [m for m in LAZY if m in loaded] == []
    opts = api.ReplayOptions(network=api.NetworkOptions(topology="ring:4:50GBps:500ns"), progress=False)
    res = api.simulate(REPO / "traces/examples/tiny_pipeline", opts).result
    # The rows the summary printed before it was computed from numpy columns, from the polars table.
    top = res.ranks.sort(["wait_ns", "rank"], descending=[True, False]).head(5)
    rows = [
        f"  {r['rank']:>6} {r['wait_ns']:>14,} {r['finish_ns']:>14,} {r['exposed_comm_ns']:>16,}"
        for r in top.iter_rows(named=True)
        if r["wait_ns"] > 0
    ]
    assert len(rows) == 2
    lines = out.splitlines()
    i = lines.index("top ranks by waiting:")
    assert lines[i + 2 : i + 2 + len(rows)] == rows
    assert len(lines) == i + 2 + len(rows)
    stages = res.ops["stage"].drop_nulls().n_unique()
    assert res.num_stages == stages
    assert any(line.startswith("pipeline bubble") for line in lines)


@pytest.mark.parametrize(
    "spec",
    [
        "ring:8:50GBps:500ns",
        "switch:6:50GBps:500ns",
        "fc:5:50GBps:500ns",
        "nodes:2*H100x8:fabric=fat_tree:k=4",
        "nodes:H100x4,A100-40GBx4:fabric=rail",
        "dgx-a100:2",
    ],
)
def test_digraph_orders_like_networkx(spec: str, monkeypatch) -> None:
    topo = topology_from_spec(spec)
    assert isinstance(topo.graph, DiGraph)
    # The reference: the same builders on a real networkx.DiGraph (what they used before).
    monkeypatch.setattr("xsim.netmodels.topology.DiGraph", nx.DiGraph)
    monkeypatch.setattr("xsim.netmodels.cluster.DiGraph", nx.DiGraph)
    twin = topology_from_spec(spec)
    ref = twin.graph
    assert type(ref) is nx.DiGraph
    assert list(topo.graph.nodes(data=True)) == list(ref.nodes(data=True))
    assert list(topo.graph.nodes(data="kind")) == list(ref.nodes(data="kind"))
    assert list(topo.graph.edges(data=True)) == list(ref.edges(data=True))
    for n in ref:
        assert list(topo.graph.successors(n)) == list(ref.successors(n))
        assert list(topo.graph.predecessors(n)) == list(ref.predecessors(n))
    assert twin.links == topo.links
    for a in range(topo.num_ranks):
        for b in range(topo.num_ranks):
            assert twin.route(a, b) == topo.route(a, b)
    conv = topo.graph.to_networkx()
    assert list(conv.edges(data=True)) == list(ref.edges(data=True))
    assert list(conv.nodes(data=True)) == list(ref.nodes(data=True))


def test_digraph_updates_attributes_like_networkx() -> None:
    g, ref = DiGraph(), nx.DiGraph()
    for h in (g, ref):
        h.add_edge("b", "a", bandwidth=1.0)
        h.add_node("a", kind="gpu")
        h.add_node("c")
        h.add_edge("b", "a", latency_ns=5.0)
        h.add_edge("a", "c", bandwidth=2.0)
        h["a"]["c"]["bandwidth"] = 3.0
    assert (
        list(g.nodes(data=True))
        == list(ref.nodes(data=True))
        == [
            ("b", {}),
            ("a", {"kind": "gpu"}),
            ("c", {}),
        ]
    )
    assert list(g.edges(data=True)) == list(ref.edges(data=True))
    assert g.has_edge("b", "a") and not g.has_edge("a", "b")
    assert g.number_of_edges() == ref.number_of_edges() == 2


@pytest.mark.parametrize("preset", [None, "3"])
def test_cli_loads_numpy_with_one_blas_thread_unless_set(preset: str | None) -> None:
    # OpenBLAS reads OPENBLAS_NUM_THREADS once, when numpy loads: the CLI sets it before, keeping a caller's.
    code = (
        "import os, sys, contextlib, io\n"
        "from xsim.cli import main\n"
        "assert 'numpy' not in sys.modules\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['replay', 'traces/examples/tiny_pipeline', '--topology', 'ring:4:50GBps:500ns',"
        " '--no-progress'])\n"
        "print(rc, 'numpy' in sys.modules, os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(REPO)
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "True", preset or "1"]


@pytest.mark.parametrize("enabled", [True, False])
def test_replay_verb_leaves_the_collector_as_it_found_it(enabled: bool) -> None:
    # `xsim replay` pauses the cyclic GC while it imports the replay stack, then restores the caller's state.
    code = (
        "import gc, sys, contextlib, io\n"
        "from xsim.cli import main\n"
        f"{'gc.enable()' if enabled else 'gc.disable()'}\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['replay', 'traces/examples/tiny_pipeline', '--topology', 'ring:4:50GBps:500ns',"
        " '--no-progress'])\n"
        "print(rc, 'xsim.api' in sys.modules, gc.isenabled())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "True", str(enabled)]


# --- the command's exit (round 4): a replay ends the process without interpreter teardown -----------------

# A module global whose finalizer writes "teardown": only interpreter teardown runs it (it writes with a
# bound os.write: sys.stderr may be gone by then). An atexit handler writes "atexit": the exit path runs
# handlers either way.
_PRELUDE = (
    "import atexit, os, sys\n"
    "class Teardown:\n"
    "    def __del__(self, write=os.write):\n"
    "        write(2, b'teardown\\n')\n"
    "keep = Teardown()\n"
    "atexit.register(lambda: sys.stderr.write('atexit\\n'))\n"
)
TINY = ["traces/examples/tiny_pipeline", "--topology", "ring:4:50GBps:500ns", "--no-progress"]


def _entry(argv: list[str], prelude: str = _PRELUDE) -> subprocess.CompletedProcess:
    """`xsim ARGV` through the console entry point (as `python -m xsim` runs it), after PRELUDE."""
    code = prelude + f"sys.argv = ['xsim', *{argv!r}]\nfrom xsim.cli import entry\nentry()\n"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )


def test_replay_exits_without_teardown_after_atexit_and_flushed_output() -> None:
    res = _entry(["replay", *TINY, "--json"])
    assert res.returncode == 0, res.stderr
    assert res.stderr.split() == ["atexit"]  # handlers ran, teardown did not
    # stdout (a pipe: block-buffered) arrived whole: the same summary as an in-process replay.
    opts = api.ReplayOptions(network=api.NetworkOptions(topology="ring:4:50GBps:500ns"))
    ref = api.simulate(REPO / TINY[0], opts).summary()
    got = json.loads(res.stdout)
    assert {k: v for k, v in got.items() if k != "perf"} == {k: v for k, v in ref.items() if k != "perf"}


def test_replay_error_exits_without_teardown_with_code_2() -> None:
    res = _entry(["replay", "no/such/set", "--topology", "ring:4:50GBps:500ns", "--no-progress"])
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert lines[0].startswith("xsim: error: no/such") and lines[1:] == ["atexit"]


def test_other_verbs_and_live_threads_get_the_normal_exit() -> None:
    # A verb that did not opt in (fast_exit) tears the interpreter down as before.
    net = ["net", "p2p", "--topology", "ring:2:50GBps:0ns", "--size", "1GB", "--src", "0", "--dst", "1"]
    res = _entry([*net, "--json"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["finish_ns"] == 20_000_000  # 1 GB over 50 GB/s
    assert res.stderr.split() == ["atexit", "teardown"]
    # A replay after which a thread still runs (started as the verb returns, so surely alive then) waits
    # for it: the normal exit. (Whether the finalizer then runs depends on the order teardown clears
    # modules in: not asserted.)
    thread = (
        "import threading, time, xsim.cmd_replay as verb\n"
        "real = verb.run\n"
        "def run(args):\n"
        "    code = real(args)\n"
        "    threading.Thread(target=lambda: (time.sleep(0.3), sys.stderr.write('thread\\n'))).start()\n"
        "    return code\n"
        "verb.run = run\n"
    )
    res = _entry(["replay", *TINY], _PRELUDE + thread)
    assert res.returncode == 0, res.stderr
    assert res.stderr.split()[:2] == ["thread", "atexit"]
    assert "iteration time" in res.stdout


def test_replay_under_a_profiler_or_tracer_gets_the_normal_exit(tmp_path: Path) -> None:
    # A profiler writes its report after the program returns: the fast exit would lose it.
    for hook in ("sys.setprofile(lambda *a: None)\n", "sys.settrace(lambda *a: None)\n"):
        res = _entry(["replay", *TINY], _PRELUDE + hook)
        assert res.returncode == 0, res.stderr
        assert res.stderr.split() == ["atexit", "teardown"], hook
    out = tmp_path / "profile.prof"
    res = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "xsim", "replay", *TINY],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    import pstats

    assert any(name == "simulate" for _, _, name in pstats.Stats(str(out)).stats)


def test_replay_outputs_through_the_entry_point_equal_in_process_ones(tmp_path: Path) -> None:
    a, b = tmp_path / "entry", tmp_path / "inproc"
    res = _entry(["replay", *TINY, "--out", str(a / "t"), "--timeline", str(a / "tl.json")])
    assert res.returncode == 0, res.stderr
    from xsim.cli import main

    assert main(["replay", *TINY, "--out", str(b / "t"), "--timeline", str(b / "tl.json")]) == 0
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert len(files) >= 5
    for f in files:
        if f.name != "perf.json":  # wall times
            assert (a / f).read_bytes() == (b / f).read_bytes(), f


@pytest.mark.parametrize("caller_froze", [False, True])
def test_replay_freezes_the_imports_during_the_run_only(caller_froze: bool) -> None:
    # The replay stack is frozen (out of the collector's generations) while the replay runs, and thawed
    # after; a caller that froze objects itself keeps them frozen and is left alone.
    code = (
        "import gc, sys, contextlib, io\n"
        f"{'gc.freeze()' if caller_froze else ''}\n"
        "before = gc.get_freeze_count()\n"
        "import xsim.api.replaying as r\n"
        "seen = []\n"
        "real = r.simulate\n"
        "def spy(*a, **k):\n"
        "    seen.append(gc.get_freeze_count())\n"
        "    return real(*a, **k)\n"
        "r.simulate = spy\n"
        "from xsim.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['replay', *{TINY!r}])\n"
        "print(rc, before, seen[0], gc.get_freeze_count())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    rc, before, during, after = map(int, res.stdout.split())
    assert rc == 0
    if caller_froze:
        # Nothing frozen or thawed here (a frozen object may still be freed: the count only drops).
        assert before > 1000 and during <= before and after <= before
    else:
        assert before == 0 and during > 10_000 and after == 0


def test_makefile_editable_install_starts_without_an_import_hook(tmp_path: Path) -> None:
    # The Makefile's editable install (its EDITABLE flags) into a fresh venv: the `xsim` command runs the
    # checkout, and an interpreter starts without setuptools' finder and the pathlib it imports.
    pytest.importorskip("setuptools")
    flags = next(ln for ln in (REPO / "Makefile").read_text().splitlines() if ln.startswith("EDITABLE :="))
    src, venv = tmp_path / "src", tmp_path / "venv"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip("not a git checkout: cannot list the files to install")
    for name in files.stdout.splitlines():
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a venv here: {made.stderr.decode()[-200:]}")
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True)
    # This interpreter's packages (pip, setuptools, the dependencies) on the new venv's path, as a path entry.
    Path(site.stdout.decode().strip(), "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cmd = [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(src)]
    r = subprocess.run([*cmd, *flags.split(":=", 1)[1].split()], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"cannot install here: {r.stderr.strip().splitlines()[-1:]}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import sys, xsim.cli; print(xsim.cli.__file__); print(' '.join(sorted(sys.modules)))"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    where, modules = r.stdout.splitlines()
    assert where == str(src / "xsim" / "cli.py")
    assert [m for m in modules.split() if "editable" in m or m in ("pathlib", "importlib.util")] == []
    # The console script is the entry point (`xsim.cli:entry`), and it runs.
    script = venv / "bin" / "xsim"
    assert "from xsim.cli import entry" in script.read_text()
    r = subprocess.run([script, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage: xsim")
