"""Fuzz xsim's input readers: mutate small real inputs, run the CLI in-process, check the failure contract.

Targets (each a small real input and the verb that reads it):
  et         bytes and node fields of a generated 4-rank `.et` set  -> trace validate | trace info | replay
  spec       the deployment spec YAML of that set                     -> gen
  astra      an ASTRA-sim network YAML and system JSON               -> replay | net collective
  kineto     a PyTorch host ET + Kineto JSON pair                    -> import pytorch
  commgroup  the set's comm_group.json                               -> trace validate | replay

Mutations: bit flips, truncation, byte insertion, chunk duplication, and replacement of a field's value
(drawn by walking the parsed document) with a hostile one: NaN, +-inf, 2**64, -1, a 5,000-digit number,
huge strings, deep nesting, wrong types, YAML aliases.

Contract per case (issue 16): exit 0; or exit 2 (1 too for `trace validate`: cross-rank findings) with
stderr naming the input: one `xsim: error:` line, or validate's findings, one line each, each starting with
a file of the input; never another exception; bounded CPU time and memory.

  python scripts/fuzz.py --cases 20000 --target et --seed 1      # a campaign (prints a summary)
  python scripts/fuzz.py --target et --seed 1 --case 1234         # rerun one case (its reproducer)

A campaign runs in a child process under RLIMIT_AS (--mem-gib), so unbounded allocation is a crash
(MemoryError), not a swapping machine. The tests (tests/test_fuzz_*.py) draw the same mutations with
hypothesis at a fixed seed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = ("et", "spec", "astra", "kineto", "commgroup")
CPU_LIMIT_S = 2.0  # per case (issue 16: "bounded time"); CPU seconds, steadier than wall time on a shared box
RSS_LIMIT_MIB = 1536  # peak RSS of the in-process harness (tests); the campaign uses RLIMIT_AS instead

# ---------------------------------------------------------------------------------------------------------
# Drawing: one interface over hypothesis (tests, shrinking) and random.Random (campaigns, reproducers).


class Draw:
    """Draws from a random.Random; `HypoDraw` in the tests draws the same choices from hypothesis data."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        return self.rng.randint(lo, hi)

    def pick(self, seq: Sequence):
        """One element of seq."""
        return seq[self.int(0, len(seq) - 1)]


# Hostile values, as text fragments of each format (JSON cannot hold NaN or a 5,000-digit int otherwise).
_DEEP = 200  # nesting past the 64-level input limit (docs/trace-format.md), below Python's recursion limit
HOSTILE_JSON = (
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "18446744073709551616",  # 2**64
    "9223372036854775808",  # 2**63
    "-9223372036854775809",
    "-1",
    "0",
    "1e-300",
    "1e308",
    "1" + "0" * 5000,  # past Python's int-string digit limit
    "0.5",
    "true",
    "null",
    '""',
    '"x"',
    '"' + "x" * 100_000 + '"',
    '"0-99999999"',
    '"a\\nb"',
    "[]",
    "{}",
    "[1, 2]",
    '{"a": 1}',
    "[" * _DEEP + "]" * _DEEP,
    '{"a": ' * _DEEP + "1" + "}" * _DEEP,
    "[" * 20_000 + "]" * 20_000,
)
HOSTILE_YAML = (
    ".nan",
    ".inf",
    "-.inf",
    "1e999",
    "18446744073709551616",
    "-1",
    "0",
    "1e-300",
    "1" + "0" * 5000,
    "0.5",
    "yes",
    "null",
    '""',
    "x" * 100_000,
    "'0-99999999'",
    '"a\\nb"',
    "[]",
    "{}",
    "[1, 2]",
    "{a: 1}",
    "[" * _DEEP + "]" * _DEEP,
    "[" * 20_000 + "]" * 20_000,
    "&a [1, 2]",
    "*a",
    "!!python/object:os.system ls",
    "!!binary AAAA",
)
HOSTILE_INT64 = (0, -1, 1, 2**31, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), 10**15, 1 << 40)
HOSTILE_FLOAT = (math.nan, math.inf, -math.inf, 1e308, 1e-300, -0.0, 0.5)
HOSTILE_STR = ("", "x" * 100_000, "1" * 5000, "0-99999999", "a\nb", "\x00", "é" * 10, "1.0", "-1")

_TOKEN = "@@XSIM_FUZZ@@"


def _paths(doc, prefix=()):
    """Every (path, value) of a parsed JSON/YAML document, containers included."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value):
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


def mutate_doc(draw: Draw, doc, dump: Callable[[object], str], hostile: Sequence[str]) -> str:
    """A parsed document with one to three fields replaced, deleted or multiplied, as text."""
    import copy

    doc = copy.deepcopy(doc)
    frags: list[str] = []
    for _ in range(draw.int(1, 3)):
        paths = list(_paths(doc))
        path, value = draw.pick(paths)
        op = draw.int(0, 9)
        if op <= 5 or not path:
            frags.append(draw.pick(hostile))
            doc = _set(doc, path, f"{_TOKEN}{len(frags) - 1}")
        elif op <= 7:
            parent = doc
            for k in path[:-1]:
                parent = parent[k]
            del parent[path[-1]]
        elif isinstance(value, list) and value:
            # Inputs stay a few MB: a copied element holding a hostile value (a 100 kB string) copies once.
            size = len(json.dumps(value[0], default=str))
            times = draw.pick((2, 100, 10_000))
            times = 1 if _TOKEN in json.dumps(value[0], default=str) else min(times, 1 + (4 << 20) // size)
            value.extend(copy.deepcopy(value[0]) for _ in range(times))  # copies: a later edit hits one
        else:
            _set(doc, path, [value, copy.deepcopy(value)])
    text = dump(doc)
    for i, frag in enumerate(frags):
        for quoted in (json.dumps(f"{_TOKEN}{i}"), f"'{_TOKEN}{i}'", f"{_TOKEN}{i}"):
            text = text.replace(quoted, frag)
    return text


def mutate_bytes(draw: Draw, data: bytes) -> bytes:
    """Bit flips, truncation, insertion or chunk duplication of raw bytes."""
    buf = bytearray(data)
    op = draw.int(0, 4)
    if op <= 1 or not buf:
        for _ in range(draw.int(1, 8)):
            if buf:
                bit = draw.int(0, len(buf) * 8 - 1)
                buf[bit // 8] ^= 1 << (bit % 8)
    elif op == 2:
        del buf[draw.int(0, len(buf) - 1) :]
    elif op == 3:
        at = draw.int(0, len(buf))
        buf[at:at] = bytes(draw.int(0, 255) for _ in range(draw.int(1, 16)))
    else:
        a = draw.int(0, len(buf) - 1)
        b = draw.int(a, min(len(buf), a + 256))
        buf[b:b] = buf[a:b] * draw.pick((2, 10, 1000))
    return bytes(buf)


def mutate_nodes(draw: Draw, nodes: list) -> list:
    """Protobuf-level edits of one rank's nodes: attribute values, types, deps, ids, duplicates."""
    from xsim.traces import pb

    nodes = [pb.Node.FromString(n.SerializeToString()) for n in nodes]
    for _ in range(draw.int(1, 3)):
        n = draw.pick(nodes)
        op = draw.int(0, 9)
        if op <= 4 and len(n.attr):
            a = draw.pick(list(n.attr))
            kind = draw.int(0, 5)
            if kind == 0:
                a.int64_val = draw.pick(HOSTILE_INT64)
            elif kind == 1:
                a.uint64_val = draw.pick((0, 2**64 - 1, 2**63, 1))
            elif kind == 2:
                a.double_val = draw.pick(HOSTILE_FLOAT)
            elif kind == 3:
                a.string_val = draw.pick(HOSTILE_STR)
            elif kind == 4:
                a.int32_val = draw.pick((-1, 2**31 - 1, -(2**31), 0))
            else:
                n.attr.append(pb.AttributeProto.FromString(a.SerializeToString()))  # a duplicate name
        elif op == 5:
            n.type = draw.pick((0, 1, 2, 3, 4, 5, 6, 7, 99, -1))
        elif op == 6:
            n.data_deps.append(draw.pick([m.id for m in nodes] + [n.id, 2**63 - 1, 123456]))
        elif op == 7:
            n.id = draw.pick([m.id for m in nodes] + [2**63 - 1, 0])
        elif op == 8:
            n.duration_micros = draw.pick((2**63 - 1, 2**53, 10**15, 0))
        else:
            nodes.remove(n)
            if not nodes:
                nodes.append(n)
    return nodes


# ---------------------------------------------------------------------------------------------------------
# Base inputs: small and real (a generated set, its spec, ASTRA-sim configs, a host ET + Kineto pair).

SPEC = """\
name: tiny
model: {base: llama2-7b, layers: 2, hidden: 256, ffn_hidden: 512, heads: 4, kv_heads: 4, vocab: 1000}
seq_len: 128
micro_batches: 2
device_groups:
  - {id: 0, gpu: H100, ranks: [0], tp: 1, layers: [1, 1], micro_batch: 1, pp_stage: 0, dp_replica: 0}
  - {id: 1, gpu: A100-40GB, ranks: [1], tp: 1, layers: [2, 2], micro_batch: 1, pp_stage: 1, dp_replica: 0}
  - {id: 2, gpu: H100, ranks: [2], tp: 1, layers: [1, 1], micro_batch: 1, pp_stage: 0, dp_replica: 1}
  - {id: 3, gpu: A100-40GB, ranks: [3], tp: 1, layers: [2, 2], micro_batch: 1, pp_stage: 1, dp_replica: 1}
"""
NETWORK = "topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
SYSTEM = {
    "scheduling-policy": "LIFO",
    "endpoint-delay": 10,
    "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 4,
    "all-reduce-implementation": ["ring"],
    "all-gather-implementation": ["ring"],
    "reduce-scatter-implementation": ["ring"],
    "all-to-all-implementation": ["ring"],
    "collective-optimization": "localBWAware",
    "local-mem-bw": 1600,
    "boost-mode": 0,
}
TOPOLOGY = "switch:4:50GBps:500ns"


def _host_and_kineto() -> tuple[dict, dict]:
    """A one-rank PyTorch host ET (schema 1.1.1-chakra.0.0.4) and Kineto trace: a forward scope, a
    matmul launching a kernel, a relu blocked in cudaDeviceSynchronize, an add, one ProfilerStep."""
    pid = 4242

    def tensor(tid: int, numel: int) -> list:
        return [tid, tid + 100, 0, numel, 4, "cpu"]

    ops = [
        (1, "[pytorch|profiler|execution_trace|process]", 1, 0, [], []),
        (2, "[pytorch|profiler|execution_trace|thread]", 1, 0, [], []),
        (3, "## forward ##", 2, 1, [], []),
        (4, "aten::mm", 3, 2, [tensor(1, 64), tensor(2, 64)], ["Tensor(float)", "Tensor(float)"]),
        (5, "aten::relu", 3, 3, [tensor(3, 64)], ["Tensor(float)"]),
        (6, "aten::add", 3, 4, [], []),
    ]
    nodes = [
        {
            "id": oid,
            "name": name,
            "ctrl_deps": parent,
            "inputs": {"values": values, "shapes": [], "types": types},
            "outputs": {"values": [], "shapes": [], "types": []},
            "attrs": [
                {"name": "rf_id", "type": "uint64", "value": rf},
                {"name": "tid", "type": "uint64", "value": 1},
                {"name": "seq_id", "type": "int64", "value": -1},
            ],
        }
        for oid, name, parent, rf, values, types in ops
    ]
    host = {"schema": "1.1.1-chakra.0.0.4", "pid": pid, "nodes": nodes[::-1]}

    def cpu(name: str, ts: float, dur: float, rf: int, cat: str = "cpu_op") -> dict:
        args = {"External id": rf + 1000, "Record function id": rf}
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": pid,
            "ts": ts,
            "dur": dur,
            "args": args,
        }

    events = [
        cpu("ProfilerStep#3", 0, 150, 0, "user_annotation"),
        cpu("## forward ##", 0, 140, 1, "user_annotation"),
        cpu("aten::mm", 10, 50, 2),
        cpu("aten::relu", 60, 75, 3),
        cpu("aten::add", 136, 4, 4),
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": pid,
            "tid": pid,
            "ts": 20,
            "dur": 5,
            "args": {"correlation": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "sgemm_128x64_nn",
            "pid": 0,
            "tid": 7,
            "ts": 30,
            "dur": 100,
            "args": {"correlation": 7, "stream": 7, "device": 0},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaDeviceSynchronize",
            "pid": pid,
            "tid": pid,
            "ts": 62,
            "dur": 70,
            "args": {"correlation": 8},
        },
    ]
    return host, {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}}


@dataclass
class Base:
    """The base inputs, made once per process under `root`."""

    root: Path
    spec_text: str = SPEC
    spec_doc: dict = field(default_factory=dict)
    et_bytes: list[bytes] = field(default_factory=list)
    et_nodes: list[list] = field(default_factory=list)
    et_meta: list = field(default_factory=list)
    comm_group: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    kineto: dict = field(default_factory=dict)


def make_base(root: Path) -> Base:
    """Generate the 4-rank set from SPEC (checked to validate and replay cleanly) and the other inputs."""
    import yaml
    from xsim.traces.stream import read_et

    b = Base(root)
    b.spec_doc = yaml.safe_load(SPEC)
    (root / "base").mkdir(parents=True, exist_ok=True)
    (root / "base" / "tiny.yaml").write_text(SPEC)
    out = root / "base" / "set"
    # Every rank's file: the targets mutate them one by one (the default writes one of the two replicas).
    res = run_cli(["gen", str(root / "base" / "tiny.yaml"), "--out", str(out), "--all-ranks"])
    if res.rc != 0 or res.crash:
        raise RuntimeError(f"base set did not generate: {res.stderr}{res.crash}")
    for r in range(4):
        p = out / f"tiny.{r}.et"
        b.et_bytes.append(p.read_bytes())
        et = read_et(p)
        b.et_nodes.append(list(et.nodes))
        b.et_meta.append(et.metadata)
    b.comm_group = json.loads((out / "comm_group.json").read_text())
    b.host, b.kineto = _host_and_kineto()
    for argv in (
        ["trace", "validate", str(out)],
        ["replay", str(out), "--topology", TOPOLOGY, "--no-progress"],
    ):
        res = run_cli(argv)
        if res.rc != 0 or res.crash:
            raise RuntimeError(f"base set fails {argv}: {res.stderr}{res.crash}")
    return b


# ---------------------------------------------------------------------------------------------------------
# Running one case in-process.


@dataclass
class Outcome:
    """What one CLI call did."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    cpu_s: float
    wall_s: float
    crash: str = ""  # the traceback of an exception other than SystemExit


def run_cli(argv: list[str]) -> Outcome:
    """`xsim ARGV` in this process: exit code, captured output, CPU and wall time, any stray exception."""
    from xsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    t0, c0 = time.perf_counter(), time.process_time()
    crash = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BaseException as exc:  # noqa: BLE001 - the point: anything else is a crash
            if isinstance(exc, KeyboardInterrupt):
                raise
            rc = -1
            crash = "".join(traceback.format_exception(exc))
    return Outcome(
        list(argv),
        rc,
        out.getvalue(),
        err.getvalue(),
        time.process_time() - c0,
        time.perf_counter() - t0,
        crash,
    )


def contract_violation(res: Outcome, names: Sequence[str], validate: bool) -> str | None:
    """Why an outcome breaks the contract, or None. names: paths of which an error line must name one."""
    if res.crash:
        return "exception: " + res.crash.strip().splitlines()[-1]
    if "Traceback" in res.stderr:
        return "traceback on stderr"
    if res.rc == 0:
        return None
    if res.rc not in ((1, 2) if validate else (2,)):
        return f"exit {res.rc}"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if validate and res.rc == 1:  # cross-rank findings are printed on stdout, invalid ones on stderr
        lines += [ln for ln in res.stdout.splitlines() if ln.strip()]
    if not lines:
        return f"exit {res.rc} with nothing on stderr"
    if lines[0].startswith("xsim: error: "):
        if len(lines) != 1:
            return f"{len(lines)} stderr lines"
        if not any(n in lines[0] for n in names):
            return "error line names no input"
        return None
    if validate:
        bad = [ln for ln in lines if not any(ln.startswith(n) for n in names)]
        return f"finding names no input: {bad[0][:200]}" if bad else None
    return "stderr is not one `xsim: error:` line"


@dataclass
class Case:
    """One prepared case: the CLI call (or a library call) and what its error lines must name."""

    argv: list[str]
    names: list[str]
    validate: bool = False
    lib: Callable[[], object] | None = None  # run instead of the CLI: the reader the verb would call
    focus: Path | None = None  # the mutated file (et: one rank's file)

    def run(self) -> Outcome:
        """The case's outcome."""
        return run_cli(self.argv) if self.lib is None else run_lib(self.argv, self.lib)


def run_lib(label: list[str], fn: Callable[[], object]) -> Outcome:
    """A library reader in-process, judged like the CLI: our own error is exit 2 with one line."""
    from xsim.netmodels.errors import NetworkModelError
    from xsim.traces.errors import XsimError

    t0, c0 = time.perf_counter(), time.process_time()
    rc, err, crash = 0, "", ""
    try:
        fn()
    except (XsimError, NetworkModelError) as exc:
        rc, err = 2, f"xsim: error: {exc}\n"
    except BaseException as exc:  # noqa: BLE001 - anything else is a crash
        if isinstance(exc, KeyboardInterrupt):
            raise
        rc, crash = -1, "".join(traceback.format_exception(exc))
    return Outcome(label, rc, "", err, time.process_time() - c0, time.perf_counter() - t0, crash)


def _read_set(setdir: Path) -> None:
    """What `trace validate` reads and checks before its dry replay: files, groups, graph and matches."""
    from xsim.traces.checks import check_all
    from xsim.traces.groups import resolve_groups
    from xsim.traces.traceset import discover

    ts = discover(setdir)
    files = [ts.load(r) for r in range(ts.num_ranks)]
    groups = resolve_groups(((f.path, f.nodes) for f in files), ts.num_ranks, directory=ts.directory)
    check_all(files, groups)


def _yaml_dump(doc) -> str:
    import yaml

    return yaml.safe_dump(doc, default_flow_style=None, sort_keys=False, width=10**9)


def prepare(target: str, draw: Draw, base: Base, work: Path, lib_share: int = 0) -> Case:
    """Write one mutated input under `work` (emptied first) and return the call that reads it.

    lib_share: of every 4 cases, how many call the target's library reader instead of the CLI verb
    (campaigns: the readers are ~10x cheaper than a whole verb; the tests run the verbs).
    """
    case = _prepare(target, draw, base, work)
    if lib_share and draw.int(0, 3) < lib_share:
        case.lib = _library_call(target, work, case.focus)
        case.argv = ["(library)", target, *case.argv]
    return case


def _library_call(target: str, work: Path, focus: Path | None = None) -> Callable[[], object]:
    """The reader behind the target's verb, on the case's files (et: the mutated file alone)."""
    if target == "et" and focus is not None:
        from xsim.traces.checks import check_file
        from xsim.traces.stream import read_et

        return lambda: check_file(read_et(focus), 0)
    if target in ("et", "commgroup"):
        return lambda: _read_set(work / "set")
    if target == "spec":
        from xsim.tracegen.spec import load_spec

        return lambda: load_spec(work / "spec.yaml")
    if target == "astra":
        from xsim.netmodels.astra import load_network_yml, load_system_json

        return lambda: (load_network_yml(work / "net.yml"), load_system_json(work / "sys.json"))
    from xsim.tracegen.importers.pytorch.hostet import load_host_trace
    from xsim.traces.kineto import load_kineto

    return lambda: (load_host_trace(work / "host.json"), load_kineto(work / "kineto.json"))


def _prepare(target: str, draw: Draw, base: Base, work: Path) -> Case:
    from xsim.traces.stream import write_et

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    setdir = work / "set"
    if target in ("et", "commgroup", "astra"):
        setdir.mkdir()
        for r in range(4):
            (setdir / f"tiny.{r}.et").write_bytes(base.et_bytes[r])
        (setdir / "comm_group.json").write_text(json.dumps(base.comm_group))
    if target == "et":
        r = draw.int(0, 3)
        path = setdir / f"tiny.{r}.et"
        if draw.int(0, 1):
            path.write_bytes(mutate_bytes(draw, base.et_bytes[r]))
        else:
            write_et(path, mutate_nodes(draw, base.et_nodes[r]), base.et_meta[r])
        verb = draw.pick(("validate", "info", "replay"))
        if verb == "replay":
            argv = ["replay", str(setdir), "--topology", TOPOLOGY, "--no-progress"]
        else:
            argv = ["trace", verb, str(setdir)]
        return Case(argv, [str(setdir)], verb == "validate", focus=path)
    if target == "commgroup":
        path = setdir / "comm_group.json"
        if draw.int(0, 3) == 0:
            path.write_bytes(mutate_bytes(draw, json.dumps(base.comm_group).encode()))
        else:
            path.write_text(mutate_doc(draw, base.comm_group, json.dumps, HOSTILE_JSON))
        verb = draw.pick(("validate", "replay"))
        if verb == "replay":
            argv = ["replay", str(setdir), "--topology", TOPOLOGY, "--no-progress"]
        else:
            argv = ["trace", "validate", str(setdir)]
        return Case(argv, [str(setdir)], verb == "validate")
    if target == "spec":
        path = work / "spec.yaml"
        if draw.int(0, 3) == 0:
            path.write_bytes(mutate_bytes(draw, SPEC.encode()))
        else:
            path.write_text(mutate_doc(draw, base.spec_doc, _yaml_dump, HOSTILE_YAML))
        return Case(["gen", str(path), "--out", str(work / "out")], [str(path), str(work)])
    if target == "astra":
        net, sys_ = work / "net.yml", work / "sys.json"
        net.write_text(NETWORK)
        sys_.write_text(json.dumps(SYSTEM))
        if draw.int(0, 1):
            doc = {"topology": ["Ring"], "npus_count": [4], "bandwidth": [50.0], "latency": [500.0]}
            net.write_text(mutate_doc(draw, doc, _yaml_dump, HOSTILE_YAML))
        else:
            sys_.write_text(mutate_doc(draw, SYSTEM, json.dumps, HOSTILE_JSON))
        astra = ["--astra-network", str(net), "--astra-system", str(sys_)]
        if draw.int(0, 3) == 0:
            argv = ["replay", str(setdir), *astra, "--no-progress"]
        else:  # one collective on the configured network: the same loaders, a tenth of the time
            kind = draw.pick(("all_reduce", "all_gather", "reduce_scatter", "all_to_all"))
            argv = [
                "net",
                "collective",
                *astra,
                "--size",
                draw.pick(("1MiB", "0", "1")),
                "--collective",
                kind,
            ]
        return Case(argv, [str(work)])
    if target == "kineto":
        et, kin = work / "host.json", work / "kineto.json"
        et.write_text(json.dumps(base.host))
        kin.write_text(json.dumps(base.kineto))
        which = draw.int(0, 3)
        doc, dest = (base.host, et) if which == 0 else (base.kineto, kin)
        if draw.int(0, 4) == 0:
            dest.write_bytes(mutate_bytes(draw, json.dumps(doc).encode()))
        else:
            dest.write_text(mutate_doc(draw, doc, json.dumps, HOSTILE_JSON))
        # A prefix in a folder of its own: the import writes that folder whole (issue 27).
        argv = [
            "import",
            "pytorch",
            "--et",
            str(et),
            "--kineto",
            str(kin),
            "--out",
            str(work / "imp" / "out"),
        ]
        return Case(argv, [str(work)])
    raise ValueError(f"unknown target {target!r}")


def max_rss_mib() -> float:
    """Peak resident set of this process so far, MiB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------------------
# Campaign.


@dataclass
class Summary:
    """A campaign's result for one target."""

    target: str
    cases: int = 0
    crashes: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (case, why, argv)
    slow: list[tuple[int, float]] = field(default_factory=list)
    max_cpu_s: float = 0.0
    max_wall_s: float = 0.0
    max_cpu_case: int = -1
    max_rss_mib: float = 0.0
    exits: dict[int, int] = field(default_factory=dict)


def case_rng(seed: int, target: str, i: int) -> random.Random:
    """The generator of case i: reproducible alone (a case's reproducer is its seed, target and number)."""
    return random.Random(f"{seed}:{target}:{i}")


def campaign(
    target: str, seed: int, cases: Sequence[int], work: Path, lib_share: int = 0, log=print
) -> Summary:
    """Run the cases of one target in this process; returns the counts, crashes and maxima."""
    base = make_base(work / "base-inputs")
    s = Summary(target)
    for i in cases:
        case = prepare(target, Draw(case_rng(seed, target, i)), base, work / "case", lib_share)
        res = case.run()
        s.cases += 1
        s.exits[res.rc] = s.exits.get(res.rc, 0) + 1
        why = contract_violation(res, case.names, case.validate)
        if res.cpu_s > CPU_LIMIT_S:
            s.slow.append((i, res.cpu_s))
            why = why or f"{res.cpu_s:.2f} s CPU (limit {CPU_LIMIT_S} s)"
        if why:
            s.crashes.append((i, why, case.argv))
            log(
                f"CRASH {target} case {i}: {why}\n  reproduce: python scripts/fuzz.py --target {target} "
                f"--seed {seed} --lib-share {lib_share} --case {i}\n{res.crash or res.stderr[-1500:]}"
            )
        if res.cpu_s > s.max_cpu_s:
            s.max_cpu_s, s.max_cpu_case = res.cpu_s, i
        s.max_wall_s = max(s.max_wall_s, res.wall_s)
        s.max_rss_mib = max(s.max_rss_mib, max_rss_mib())
    return s


def _child(target: str, seed: int, lo: int, hi: int, mem_gib: float, lib_share: int, out: str) -> None:
    """One campaign chunk in a fresh process under RLIMIT_AS; writes its Summary as JSON."""
    lim = int(mem_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    with tempfile.TemporaryDirectory(prefix=f"xsim-fuzz-{target}-") as tmp:
        s = campaign(target, seed, range(lo, hi), Path(tmp), lib_share, log=lambda m: print(m, flush=True))
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(s.__dict__, fh)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: a campaign over targets, or one case's reproducer."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=TARGETS, action="append", help="target(s) (default: all)")
    ap.add_argument("--cases", type=int, default=1000, help="cases per target")
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2000, help="cases per child process")
    ap.add_argument("--mem-gib", type=float, default=4.0, help="RLIMIT_AS of each child process")
    ap.add_argument(
        "--lib-share",
        type=int,
        default=0,
        choices=range(5),
        help="of 4 cases, how many call the reader alone",
    )
    ap.add_argument("--case", type=int, help="run only this case and print its input and outcome")
    ap.add_argument("--json", help="write the per-target summaries to this file")
    args = ap.parse_args(argv)
    targets = args.target or list(TARGETS)
    if args.case is not None:
        with tempfile.TemporaryDirectory(prefix="xsim-fuzz-") as tmp:
            base = make_base(Path(tmp) / "base-inputs")
            for t in targets:
                case = prepare(
                    t, Draw(case_rng(args.seed, t, args.case)), base, Path(tmp) / "case", args.lib_share
                )
                res = case.run()
                print(f"{t} case {args.case}: xsim {' '.join(case.argv)}")
                print(f"exit {res.rc}, {res.cpu_s:.3f} s CPU; stderr:\n{res.stderr[-3000:]}{res.crash}")
                print(f"contract: {contract_violation(res, case.names, case.validate) or 'kept'}")
        return 0
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = {}
    t0 = time.time()
    for t in targets:
        total = Summary(t)
        for lo in range(args.start, args.start + args.cases, args.chunk):
            hi = min(lo + args.chunk, args.start + args.cases)
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
                out = fh.name
            p = ctx.Process(target=_child, args=(t, args.seed, lo, hi, args.mem_gib, args.lib_share, out))
            p.start()
            p.join()
            if p.exitcode != 0 or os.path.getsize(out) == 0:
                total.crashes.append(
                    (lo, f"child process died (exit {p.exitcode}) in cases {lo}-{hi - 1}", [])
                )
                print(f"CRASH {t}: child died (exit {p.exitcode}) in cases {lo}-{hi - 1}", flush=True)
                continue
            with open(out, encoding="utf-8") as fh:
                part = json.load(fh)
            os.unlink(out)
            total.cases += part["cases"]
            total.crashes += [tuple(c) for c in part["crashes"]]
            total.slow += [tuple(c) for c in part["slow"]]
            if part["max_cpu_s"] > total.max_cpu_s:
                total.max_cpu_s, total.max_cpu_case = part["max_cpu_s"], part["max_cpu_case"]
            total.max_wall_s = max(total.max_wall_s, part["max_wall_s"])
            total.max_rss_mib = max(total.max_rss_mib, part["max_rss_mib"])
            for k, v in part["exits"].items():
                total.exits[int(k)] = total.exits.get(int(k), 0) + v
            print(
                f"{t}: {total.cases} cases, {len(total.crashes)} crashes, max {total.max_cpu_s:.3f} s CPU "
                f"(case {total.max_cpu_case}), max RSS {total.max_rss_mib:.0f} MiB, {time.time() - t0:.0f} s",
                flush=True,
            )
        results[t] = total.__dict__
    print(
        json.dumps({t: {k: v for k, v in r.items() if k != "crashes"} for t, r in results.items()}, indent=1)
    )
    n = sum(r["cases"] for r in results.values())
    c = sum(len(r["crashes"]) for r in results.values())
    print(f"total: {n} cases, {c} crashes, {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 1 if c else 0


if __name__ == "__main__":
    sys.exit(main())
