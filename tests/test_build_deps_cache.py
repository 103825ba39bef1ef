"""The program builder checks a rank's dependency graph for cycles once per distinct program, also when the
files are not in id order (a compact set's derived ranks; issue 24 flow round 4), and still refuses a rank
whose graph has a cycle."""

from __future__ import annotations

from pathlib import Path

import pytest
from xsim.replay import ReplayConfig
from xsim.replay import build as build_module
from xsim.replay.errors import TraceGraphError
from xsim.replay.program import build_program
from xsim.replay.simulation import ColumnReader, load_groups
from xsim.traces import pb
from xsim.traces.attrs import make_node
from xsim.traces.traceset import discover, write_trace_set

from tests.program_reference import reference_program


def _chain(ids: list[int], deps: dict[int, int]) -> list[pb.Node]:
    """Compute nodes in the order of `ids`, node i depending on deps[i] where given."""
    return [
        make_node(i, f"k{i}", pb.COMP_NODE, data_deps=[deps[i]] if i in deps else [], duration_micros=10 + i)
        for i in ids
    ]


def _build(tmp: Path, ranks: list[list[pb.Node]], monkeypatch) -> tuple[list[int], object, object]:
    write_trace_set(str(tmp / "t"), ranks)
    ts = discover(str(tmp / "t"))
    groups = load_groups(ts, None)
    checked = []
    real = build_module.unready

    def counting(ndeps, children):
        checked.append(len(ndeps))
        return real(ndeps, children)

    monkeypatch.setattr(build_module, "unready", counting)
    prog = build_program(ts, groups, None, ReplayConfig(), columns=ColumnReader(ts).get, release=False)
    return checked, prog, reference_program(ts, groups, None, ReplayConfig())


def test_ranks_with_the_same_program_out_of_id_order_share_one_cycle_check(tmp_path: Path, monkeypatch):
    # Four ranks, each the chain 1 <- 2 <- 3 <- 4 (a backward edge 4 -> 1 would make the check needed:
    # here node 1 depends on node 4, which is written first), nodes written in the order 4, 2, 3, 1: not
    # in id order, the same program on every rank. One check (of 4 nodes), and the program is the
    # node-by-node reference builder's.
    rank = _chain([4, 2, 3, 1], {2: 1, 3: 2, 1: 4})
    checked, prog, ref = _build(tmp_path, [rank] * 4, monkeypatch)
    assert checked == [4]
    assert prog.num_nodes == ref.num_nodes == 16
    assert prog.ndeps.tolist() == list(ref.ndeps)


def test_a_rank_whose_order_differs_is_checked_on_its_own_and_a_cycle_still_fails(tmp_path, monkeypatch):
    # Rank 1 writes the same nodes in another order (2, 4, 3, 1): its own key, its own check. Rank 2 closes
    # a cycle (4 depends on 3, 3 on 2, 2 on 1, 1 on 4): refused, naming a node on the cycle.
    ok = _chain([4, 2, 3, 1], {2: 1, 3: 2, 1: 4})
    other = _chain([2, 4, 3, 1], {2: 1, 3: 2, 1: 4})
    checked, _, _ = _build(tmp_path / "a", [ok, other, ok], monkeypatch)
    assert checked == [4, 4]
    cyc = _chain([4, 2, 3, 1], {2: 1, 3: 2, 1: 4, 4: 3})
    with pytest.raises(TraceGraphError, match="cycle"):
        _build(tmp_path / "b", [ok, cyc], monkeypatch)
