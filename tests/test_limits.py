"""Issue 16 limits: hostile sizes fail fast with exit 2 and one stderr line, under memory and time bounds."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from xsim.traces import pb
from xsim.traces.stream import write_et

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def _bound(mem_bytes: int):
    def pre() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    return pre


def _run(cwd: Path, *argv: str, mem: int = 3 * GIB, timeout: float = 60, env: dict | None = None):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "xsim", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_bound(mem),
        env=full_env,
    )
    return proc


def _one_line_exit2(proc, *expect: str) -> str:
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert "Traceback" not in err
    for word in expect:
        assert word in lines[0], lines[0]
    return lines[0]


def _comp(i: int) -> pb.Node:
    n = pb.Node(id=i, name=f"c{i}", type=pb.COMP_NODE, duration_micros=10)
    return n


@pytest.fixture()
def small_set(tmp_path: Path) -> Path:
    for r in range(2):
        write_et(tmp_path / f"t.{r}.et", [_comp(1), _comp(2)])
    return tmp_path


@pytest.mark.parametrize("verb", ["info", "validate"])
def test_stray_huge_rank_file_is_named(small_set: Path, verb: str) -> None:
    # 2 files plus a stray rank 10^12: ranks must be 0..N-1 of N files; the stray file is named at once.
    write_et(small_set / "t.1000000000000.et", [_comp(1)])
    proc = _run(small_set, "trace", verb, "t", mem=2 * GIB, timeout=30)
    _one_line_exit2(proc, "t.1000000000000.et", "rank 1000000000000", "0..2")


def test_stray_huge_rank_file_replay(small_set: Path) -> None:
    write_et(small_set / "t.1000000000000.et", [_comp(1)])
    proc = _run(small_set, "replay", "t", mem=2 * GIB, timeout=30)
    _one_line_exit2(proc, "t.1000000000000.et")


def test_stray_huge_rank_in_folder(small_set: Path) -> None:
    write_et(small_set / "t.99999999999999999999.et", [_comp(1)])
    proc = _run(small_set, "trace", "info", ".", mem=2 * GIB, timeout=30)
    _one_line_exit2(proc, "t.99999999999999999999.et")


def test_zero_byte_et_is_bounded(tmp_path: Path) -> None:
    # 16 MiB of zero bytes: one empty GlobalMetadata then 16,777,215 empty node frames, past XSIM_MAX_NODES.
    (tmp_path / "z.0.et").write_bytes(b"\x00" * (16 << 20))
    proc = _run(tmp_path, "trace", "info", "z.0.et", mem=3 * GIB, timeout=60)
    _one_line_exit2(proc, "z.0.et", "XSIM_MAX_NODES")


def test_zero_byte_et_node_limit_env(tmp_path: Path) -> None:
    # The limit is exact: 3 empty node frames pass under XSIM_MAX_NODES=3 and fail under 2.
    (tmp_path / "z.0.et").write_bytes(b"\x00" * 4)
    ok = _run(tmp_path, "trace", "info", "z.0.et", env={"XSIM_MAX_NODES": "3"})
    assert "XSIM_MAX_NODES" not in ok.stderr
    bad = _run(tmp_path, "trace", "info", "z.0.et", env={"XSIM_MAX_NODES": "2"})
    _one_line_exit2(bad, "more than 2 nodes", "XSIM_MAX_NODES")


def _gzip_zeros(path: Path, size: int) -> None:
    # One gzip member of 1 MiB of zeros, repeated: concatenated members inflate to the concatenation (as
    # gzip does), so a 1 GiB bomb costs a few milliseconds to write.
    member = gzip.compress(b"\x00" * (1 << 20), compresslevel=9, mtime=0)
    with open(path, "wb") as fh:
        for _ in range(size >> 20):
            fh.write(member)


def test_gzip_bomb_et_past_inflate_limit(tmp_path: Path) -> None:
    # ~1 MB of gzip inflating to 1 GiB; with the limit at 256 MiB it stops inflating there.
    _gzip_zeros(tmp_path / "b.0.et.gz", GIB)
    assert (tmp_path / "b.0.et.gz").stat().st_size < 2 << 20
    proc = _run(
        tmp_path,
        "trace",
        "info",
        "b.0.et.gz",
        mem=2 * GIB,
        timeout=60,
        env={"XSIM_MAX_INFLATE_BYTES": str(256 << 20)},
    )
    _one_line_exit2(proc, "b.0.et.gz", f"inflates past {256 << 20} bytes", "XSIM_MAX_INFLATE_BYTES")


def test_gzip_bomb_kineto_json(tmp_path: Path) -> None:
    # A gzipped Kineto-looking JSON of 512 MiB of spaces inside a string, read by `xsim import`.
    path = tmp_path / "k.json.gz"
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(path, "wb") as fh:
        fh.write(comp.compress(b'{"traceEvents": [], "x": "'))
        block = b" " * (1 << 20)
        for _ in range(512):
            fh.write(comp.compress(block))
        fh.write(comp.compress(b'"}'))
        fh.write(comp.flush())
    from xsim.traces.io import read_json
    from xsim.traces.limits import InputLimitError

    os.environ["XSIM_MAX_INFLATE_BYTES"] = str(64 << 20)
    try:
        with pytest.raises(InputLimitError, match="inflates past 67108864 bytes"):
            read_json(path)
    finally:
        del os.environ["XSIM_MAX_INFLATE_BYTES"]


def test_inflate_matches_gzip_and_concatenated_members(tmp_path: Path) -> None:
    from xsim.traces.limits import inflate

    a, b = b"hello " * 1000, b"world" * 7
    both = gzip.compress(a, mtime=0) + gzip.compress(b, mtime=0)
    assert inflate(both, "x") == a + b
    with pytest.raises(EOFError):
        inflate(gzip.compress(a, mtime=0)[:-12], "x")


def test_deep_json_is_one_line(tmp_path: Path) -> None:
    # 100,000 nested arrays: json's recursion limit, and a 100-deep one past the default depth of 64.
    from xsim.traces.io import JsonFileError, read_json

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(JsonFileError, match="nesting too deep"):
        read_json(deep)
    mid = tmp_path / "mid.json"
    mid.write_text(json.dumps({"a": [[[0]]]}))
    assert read_json(mid) == {"a": [[[0]]]}
    mid.write_text("[" * 100 + "]" * 100)
    with pytest.raises(JsonFileError, match="deeper than 64 levels"):
        read_json(mid)


_DG = "device_groups:\n  - {id: 0, gpu: H100, ranks: [0], tp: 1, layers: [1, 32], micro_batch: 2, pp_stage: 0, dp_replica: 0}\n"
_BASE = "model: llama2-7b\nseq_len: 2048\nmicro_batches: 4\n"


def _billion_laughs() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


SPEC_CASES = {
    # 9^10 = 3.5e9 "lol"s by reference: refused at the first alias, before composing.
    "laughs.yaml": (_BASE + "name: bl\ngpus: {H100: *j}\n" + _DG, _billion_laughs(), "YAML aliases (*a)"),
    "deep.yaml": ("name: d\nmodel: " + "[" * 5000 + "]" * 5000 + "\n", "", "deeper than 64 levels"),
    "deep.json": ('{"name": "d", "model": ' + "[" * 100_000 + "]" * 100_000 + "}", "", "nesting too deep"),
    "mid.json": ('{"name": "d", "model": ' + "[" * 70 + "]" * 70 + "}", "", "deeper than 64 levels"),
    "ranks.yaml": (
        _BASE + "name: rr\n" + _DG.replace("ranks: [0]", "ranks: '0-99999999'"),
        "",
        "at most 1,048,576 ranks",
    ),
    "flops.json": (
        json.dumps(
            {
                "name": "pf",
                "model": "llama2-7b",
                "gpus": {"H100": {"peak_flops": 1e-300}},
                "device_groups": [{"id": 0, "gpu": "H100", "ranks": [0], "layers": [1, 32]}],
            }
        ),
        "",
        "peak_flops 1e-300 is below 1e+09",
    ),
    "price.yaml": (
        _BASE + "name: pi\ngpus: {H100: {price_per_hour: .inf}}\n" + _DG,
        "",
        "must be a finite number",
    ),
    "newline.yaml": (_BASE + 'name: "abc\\n"\n' + _DG, "", "name must be a file-name-safe word"),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_hostile_spec_is_one_line(tmp_path: Path, case: str) -> None:
    body, prelude, expect = SPEC_CASES[case]
    (tmp_path / case).write_text(prelude + body)
    proc = _run(tmp_path, "gen", case, "--out", "out", mem=2 * GIB, timeout=30)
    _one_line_exit2(proc, case, expect)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_name_regex_refuses_trailing_newline() -> None:
    from xsim.tracegen.spec import NAME_RE

    assert NAME_RE.match("abc") and not NAME_RE.match("abc\n")


def test_yaml_spec_without_aliases_still_loads(tmp_path: Path) -> None:
    from xsim.tracegen.spec import read_spec_file

    (tmp_path / "s.yaml").write_text(_BASE + "name: ok\n" + _DG)
    assert read_spec_file(tmp_path / "s.yaml")["device_groups"][0]["layers"] == [1, 32]


SHARED_SET = (
    ROOT.parent / "shared" / "peer_traces" / "chakra_et" / "astra-sim_custom_ring_allreduce_8npus_1MB"
)
RING8 = "topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
SYSTEM = {
    "endpoint-delay": 10,
    "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 4,
    "all-reduce-implementation": ["ring"],
    "local-mem-bw": 1600,
}


@pytest.mark.skipif(not SHARED_SET.is_dir(), reason="../shared peer traces absent")
@pytest.mark.parametrize(
    "case",
    ["splits", "latency_nan", "bandwidth_zero", "endpoint_delay", "local_mem_bw", "nested"],
)
def test_hostile_astra_config_cli(tmp_path: Path, case: str) -> None:
    net, system = RING8, dict(SYSTEM)
    expect = {
        "splits": "'preferred-dataset-splits' must be at most 1,024",
        "latency_nan": "latency must be 0 to 1e+12 ns, got nan",
        "bandwidth_zero": "bandwidth must be 0.001 to 1e+09 GB/s, got 1e-300",
        "endpoint_delay": "'endpoint-delay' must be at most 1,000,000,000,000",
        "local_mem_bw": "'local-mem-bw' must be a finite number >= 0.001",
        "nested": "'latency' entry [[500.0]] is not a number",
    }[case]
    if case == "splits":
        system["preferred-dataset-splits"] = 1_000_000_000  # once: a hang, one event per chunk
    elif case == "latency_nan":
        net = net.replace("[ 500.0 ]", "[ .nan ]")
    elif case == "bandwidth_zero":
        net = net.replace("[ 50.0 ]", "[ 1.0e-300 ]")
    elif case == "endpoint_delay":
        system["endpoint-delay"] = 10**20
    elif case == "local_mem_bw":
        system["local-mem-bw"] = 1e-300  # once: reductions of 0 ns and a 10 ns iteration
    elif case == "nested":
        net = net.replace("[ 500.0 ]", "[ [[500.0]] ]")
    (tmp_path / "net.yml").write_text(net)
    (tmp_path / "sys.json").write_text(json.dumps(system))
    argv = ("replay", str(SHARED_SET), "--astra-network", "net.yml", "--astra-system", "sys.json")
    proc = _run(tmp_path, *argv, mem=3 * GIB, timeout=60)
    _one_line_exit2(proc, expect)


def test_astra_loader_bounds(tmp_path: Path) -> None:
    from xsim.netmodels.astra import AstraConfigError, load_network_yml, system_from_dict

    ok = system_from_dict({**SYSTEM, "preferred-dataset-splits": 1024, "endpoint-delay": 10**12})
    assert (ok.preferred_dataset_splits, ok.endpoint_delay_ns) == (1024, 10**12)
    for bad in ({"local-mem-bw": float("inf")}, {"active-chunks-per-dimension": 1025}):
        with pytest.raises(AstraConfigError):
            system_from_dict({**SYSTEM, **bad})
    for net in (RING8.replace("[ 500.0 ]", "[ .inf ]"), RING8.replace("[ Ring ]", "[ [Ring] ]")):
        (tmp_path / "n.yml").write_text(net)
        with pytest.raises(AstraConfigError):
            load_network_yml(tmp_path / "n.yml")
    (tmp_path / "n.yml").write_text(RING8.replace("[ 50.0 ]", "[ 0.001 ]"))
    assert load_network_yml(tmp_path / "n.yml").dims[0].bandwidth_gbps == 0.001


def test_astra_roofline_rates_finite(tmp_path: Path) -> None:
    from xsim.replay.errors import ReplayError

    from xsim.api.compute import astra_roofline

    path = tmp_path / "sys.json"
    for bad, msg in (("NaN", "must be a finite number"), ("1e-300", "must be >= 0.001 GB/s")):
        path.write_text('{"roofline-enabled": 1, "peak-perf": 900, "local-mem-bw": ' + bad + "}")
        with pytest.raises(ReplayError, match=msg):
            astra_roofline(str(path))


def _dup_set(tmp_path: Path, both: bool) -> None:
    from xsim.traces.attrs import make_attr, make_node

    for r in range(2):
        ar = make_node(2, "ar", pb.COMM_COLL_NODE, data_deps=[1], attrs={"comm_type": pb.ALL_REDUCE})
        ar.attr.append(make_attr("comm_size", 1 << 20))
        if r == 0 or both:
            ar.attr.append(make_attr("comm_size", 1 << 30))  # a second comm_size: 1 GiB after 1 MiB
        write_et(tmp_path / f"d.{r}.et", [_comp(1), ar])


@pytest.mark.parametrize(
    "verb", [("trace", "info"), ("trace", "validate"), ("replay", "--topology", "switch:2:50GBps:500ns")]
)
def test_duplicate_comm_size_is_one_error_everywhere(tmp_path: Path, verb: tuple[str, ...]) -> None:
    # info and validate once read the first comm_size (1 MiB), replay the last (1 GiB), all exit 0.
    _dup_set(tmp_path, both=False)
    proc = _run(tmp_path, *verb, "d", timeout=60)
    line = _one_line_exit2(proc, "attribute 'comm_size' given twice on one node", "id 2")
    assert "d.0.et" in line


def test_single_comm_size_still_replays(tmp_path: Path) -> None:
    from xsim.traces import attrs as A

    node = pb.Node(id=3)
    node.attr.append(A.make_attr("comm_size", 5))
    assert A.get_int(node, "comm_size") == 5
    node.attr.append(A.make_attr("comm_size", 6))
    with pytest.raises(Exception, match="given twice"):
        A.get_int(node, "comm_size")


def test_json_text_limit_and_dev_zero(tmp_path: Path, monkeypatch) -> None:
    from xsim.traces.io import read_json
    from xsim.traces.limits import InputLimitError

    monkeypatch.setenv("XSIM_MAX_JSON_BYTES", "100")
    (tmp_path / "a.json").write_text('{"x": "' + "y" * 91 + '"}')  # exactly 100 bytes: read
    assert read_json(tmp_path / "a.json") == {"x": "y" * 91}
    (tmp_path / "b.json").write_text('{"x": "' + "y" * 92 + '"}')  # 101 bytes: refused unread
    with pytest.raises(InputLimitError, match="larger than 100 bytes .XSIM_MAX_JSON_BYTES"):
        read_json(tmp_path / "b.json")
    (tmp_path / "c.json.gz").write_bytes(gzip.compress(('{"x": "' + "y" * 92 + '"}').encode()))
    with pytest.raises(InputLimitError, match="inflates past 100 bytes .XSIM_MAX_JSON_BYTES"):
        read_json(tmp_path / "c.json.gz")
    if os.path.exists("/dev/zero"):
        with pytest.raises(InputLimitError, match="larger than 100 bytes"):
            read_json("/dev/zero")


def test_kineto_bomb_cli_default_limits(tmp_path: Path) -> None:
    # ~2 MB of gzip inflating to 2 GiB of JSON, with the default limits, under a 2 GiB address-space bound:
    # refused at the 1 GiB JSON limit (it once ran out of memory at 2.4 GB).
    path = tmp_path / "k.json.gz"
    member = gzip.compress(b"a" * (1 << 20), compresslevel=9, mtime=0)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "', mtime=0))
        for _ in range(2048):
            fh.write(member)
        fh.write(gzip.compress(b'"}]}', mtime=0))
    argv = ("import", "pytorch", "--et", "k.json.gz", "--kineto", "k.json.gz", "--out", "out/run")
    proc = _run(tmp_path, *argv, mem=2 * GIB + GIB // 2, timeout=120)
    _one_line_exit2(proc, "k.json.gz", "XSIM_MAX_JSON_BYTES")


def test_one_rank_with_a_million_layers_is_refused_before_building(tmp_path: Path) -> None:
    # 10^6 layers x 1 micro-batch on one rank: >= 10M nodes in one file, past XSIM_MAX_NODES (2^23); it once
    # passed the set-wide step guard and grew past 19.8 GB. Under a 2 GiB bound it fails at once.
    spec = (
        "name: big\nmodel: {base: llama2-7b, layers: 1000000}\nseq_len: 2048\nmicro_batches: 1\n"
        + _DG.replace("[1, 32]", "[1, 1000000]").replace("micro_batch: 2", "micro_batch: 1")
    )
    (tmp_path / "big.yaml").write_text(spec)
    proc = _run(tmp_path, "gen", "big.yaml", "--out", "out", mem=2 * GIB, timeout=60)
    _one_line_exit2(proc, "big.yaml", "1,000,000 (layer, micro-batch) steps", "XSIM_MAX_NODES")


def test_spec_size_limit_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec of exactly XSIM_MAX_SPEC_BYTES loads; one byte more is one line naming the limit."""
    from xsim.tracegen.errors import SpecError
    from xsim.tracegen.spec import read_spec_file

    body = (_BASE + "name: sz\n" + _DG).encode()
    monkeypatch.setenv("XSIM_MAX_SPEC_BYTES", str(len(body)))
    (tmp_path / "ok.yaml").write_bytes(body)
    assert read_spec_file(tmp_path / "ok.yaml")["name"] == "sz"
    (tmp_path / "big.yaml").write_bytes(body + b"\n")
    with pytest.raises(SpecError, match=f"larger than {len(body):,} bytes.*XSIM_MAX_SPEC_BYTES"):
        read_spec_file(tmp_path / "big.yaml")


def test_spec_from_dev_zero_stops_at_the_limit(tmp_path: Path) -> None:
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    proc = _run(tmp_path, "gen", "zero.yaml", "--out", "out", mem=1 * GIB, timeout=30)
    _one_line_exit2(proc, "zero.yaml", "larger than 524,288 bytes")


def test_yaml_checks_hold_on_the_event_stream(tmp_path: Path) -> None:
    """Aliases anywhere, nesting one past the limit, and duplicate keys are refused; a key-rich spec loads."""
    from xsim.tracegen.errors import SpecError
    from xsim.tracegen.spec import read_spec_file

    cases = {
        "alias.yaml": ("x: &a 1\ny: *a\n", r"YAML aliases \(\*a\).*line 2"),
        "deep.yaml": ("x: " + "[" * 64 + "]" * 64 + "\n", "deeper than 64 levels"),
        "dup.yaml": ("name: a\nname: b\n", "key 'name' given twice"),
    }
    for name, (text, pattern) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SpecError, match=pattern):
            read_spec_file(tmp_path / name)
    (tmp_path / "ok.yaml").write_text("x: " + "[" * 63 + "]" * 63 + "\n")
    depth, v = 0, read_spec_file(tmp_path / "ok.yaml")["x"]
    while isinstance(v, list):
        depth, v = depth + 1, (v[0] if v else None)
    assert depth == 63


def test_a_sets_own_deployment_json_scales_with_the_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`xsim replay` reads the deployment.json `xsim gen` wrote under 1 KiB per rank of the set, even past
    the spec limit (issue 24: 895 KB for 16,384 ranks tripped 512 KiB); the same file as a hand-written
    spec keeps the spec limit, and a deployment.json past 1 KiB per rank is still refused."""
    from xsim.tracegen.errors import SpecError
    from xsim.tracegen.spec import load_spec
    from xsim.traces.limits import max_set_metadata_bytes

    from xsim import api

    spec = {"name": "meta", "model": "llama2-7b", "seq_len": 128, "micro_batches": 1,
            "parallel": {"gpu": "H100", "tp": 1, "pp": 2, "dp": 2}}  # fmt: skip
    api.generate(spec, api.GenerateOptions(out=str(tmp_path / "set")))
    dep = tmp_path / "set" / "deployment.json"
    size = dep.stat().st_size
    assert 1000 < size <= 4 * 1024  # 4 ranks: under 1 KiB each
    monkeypatch.setenv("XSIM_MAX_SPEC_BYTES", "1000")  # the hand-written spec limit, below the file's size
    assert max_set_metadata_bytes(4) == 4096
    with pytest.raises(SpecError, match="larger than 1,000 bytes"):
        load_spec(dep)
    run = api.simulate(str(tmp_path / "set"), api.ReplayOptions(progress=False))
    assert run.deployment is not None and run.result.summary_dict()["num_ranks"] == 4
    dep.write_bytes(dep.read_bytes() + b" " * (4096 - size + 1))  # one byte past 1 KiB per rank
    with pytest.raises(SpecError, match="larger than 4,096 bytes"):
        api.simulate(str(tmp_path / "set"), api.ReplayOptions(progress=False))


def test_out_of_memory_is_one_line_with_the_runs_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A MemoryError anywhere under a verb is one stderr line naming the run's size and what to try, exit 2
    (issue 24: a numpy MemoryError traceback at 16 GB)."""
    import xsim.replay.simulation as simulation
    import xsim.tracegen.workload as workload

    from xsim import api
    from xsim.cli import main

    spec = {"name": "oom", "model": "llama2-7b", "seq_len": 128, "micro_batches": 1,
            "parallel": {"gpu": "H100", "tp": 2, "pp": 2, "dp": 2}}  # fmt: skip
    api.generate(spec, api.GenerateOptions(out=str(tmp_path / "set")))
    total = sum(p.stat().st_size for p in (tmp_path / "set").glob("*.et"))

    def no_memory(*_a, **_k):
        raise MemoryError

    monkeypatch.setattr(simulation, "_simulate", no_memory)
    assert main(["replay", str(tmp_path / "set"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        f"xsim: error: out of memory in `xsim replay` on {tmp_path / 'set'} (8 ranks, {total / 1e9:.2f} GB "
        "of trace files); try: keep folding on (the default; not --no-fold)"
    )
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setattr(workload, "generate", no_memory)
    assert main(["gen", str(tmp_path / "spec.json"), "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"xsim: error: out of memory in `xsim gen` on {tmp_path / 'spec.json'} (8 ranks, 4 device groups, "
        "1 micro-batches); try: lower micro_batches or the ranks in the spec, or give the process more memory\n"
    )
