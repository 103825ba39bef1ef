"""Issue 16 fuzz layer: mutated real inputs never crash, hang or swell; failures are one line, exit 2.

Each target mutates a small real input (scripts/fuzz.py: a generated 4-rank `.et` set, its spec, ASTRA-sim
network/system configs, a host ET + Kineto pair, comm_group.json) with hypothesis at a fixed seed
(derandomize) and runs the verb that reads it in-process. The contract (scripts/fuzz.contract_violation):
exit 0, or exit 2 (validate: 1 or 2) with stderr naming the input in one `xsim: error:` line or one
finding per line; no other exception; at most CPU_LIMIT_S CPU seconds per case; memory bounded by an
RLIMIT_AS of the current address space + MEM_HEADROOM (an allocation past it is a MemoryError, a crash).
About 2,000 cases in all; the long campaign is in docs/robustness.md.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scripts.fuzz import CPU_LIMIT_S, Draw, contract_violation, make_base, prepare

MEM_HEADROOM = 2 << 30  # bytes of address space a case may add (the base run uses ~150 MiB)
CASES = {"et": 800, "kineto": 450, "commgroup": 400, "spec": 150, "astra": 200}  # 2,000 in all
# Of every 4 cases, how many call the target's reader alone (the rest run the whole verb): the budget.
LIB_SHARE = {"et": 1, "commgroup": 1}


class HypoDraw(Draw):
    """The harness's choices drawn from hypothesis data, so failures shrink to a small mutation."""

    def __init__(self, data) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        return self.data.draw(st.integers(lo, hi))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory.mktemp("fuzz-base"))


@pytest.fixture()
def bounded_memory():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as fh:
        vm = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmSize:"))
    cap = vm + MEM_HEADROOM if hard == resource.RLIM_INFINITY else min(hard, vm + MEM_HEADROOM)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _fuzz(target: str, base, work: Path) -> None:
    @settings(
        max_examples=CASES[target],
        derandomize=True,  # a fixed seed: the same cases on every run
        deadline=None,  # time is bounded below, in CPU seconds (steady on a shared machine)
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def case(data) -> None:
        c = prepare(target, HypoDraw(data), base, work, LIB_SHARE.get(target, 0))
        res = c.run()
        why = contract_violation(res, c.names, c.validate)
        assert why is None, f"xsim {' '.join(c.argv)}: {why}\n{res.crash or res.stderr[-2000:]}"
        assert res.cpu_s < CPU_LIMIT_S, f"xsim {' '.join(c.argv)}: {res.cpu_s:.2f} s CPU"

    case()


@pytest.mark.parametrize("target", sorted(CASES))
def test_fuzz_target_keeps_the_contract(target: str, base, tmp_path: Path, bounded_memory) -> None:
    _fuzz(target, base, tmp_path / "case")


def test_contract_catches_what_it_should() -> None:
    # The checker itself: a traceback, a second line, an unnamed input and exit 1 outside validate fail.
    from scripts.fuzz import Outcome

    ok = Outcome([], 2, "", "xsim: error: /in/x.et: bad\n", 0.1, 0.1)
    assert contract_violation(ok, ["/in"], False) is None
    assert contract_violation(Outcome([], 0, "", "", 0, 0), ["/in"], False) is None
    two = Outcome([], 2, "", "xsim: error: /in/x.et: bad\nmore\n", 0, 0)
    assert contract_violation(two, ["/in"], False) == "2 stderr lines"
    assert contract_violation(ok, ["/elsewhere"], False) == "error line names no input"
    assert contract_violation(Outcome([], 1, "", "x\n", 0, 0), ["/in"], False) == "exit 1"
    crash = Outcome([], -1, "", "", 0, 0, "Traceback ...\nValueError: boom\n")
    assert contract_violation(crash, ["/in"], False) == "exception: ValueError: boom"
    finding = Outcome([], 1, "/in/t.1.et, rank 1: unmatched [x]\n", "", 0, 0)
    assert contract_violation(finding, ["/in"], True) is None
    assert contract_violation(finding, ["/other"], True).startswith("finding names no input")
