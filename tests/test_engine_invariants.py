"""Invariants: a consistent state passes; each kind of corruption trips them."""
from __future__ import annotations

import pytest

from engine.core.allocation import Allocation
from engine.core.invariants import InvariantViolation, check_invariants
from engine.core.state import EngineState, JobStatus, StateError
from tests.test_engine_helpers import cluster, grid, job


def _state():
    st = EngineState(cluster(("a100", 2, 4)), [job("A", 0.0, 10), job("B", 0.0, 10), job("C", 0.0, 10)])
    for j in ("A", "B", "C"):
        st.submit(j, 0.0)
    st.start("A", Allocation(grid("a100", 1, 2), ((0, 0), (0, 1))), 0.0)
    st.start("B", Allocation(grid("a100", 2, 1), ((0, 2), (1, 0))), 0.0)
    return st


def test_consistent_state_passes():
    st = _state()
    check_invariants(st, 0.0, None)
    st.set_progress("A", 3.0)
    check_invariants(st, 300.0, 0.0, {"A": 3.0})


@pytest.mark.parametrize("corrupt, match", [
    (lambda st: st.cluster.owner[1].__setitem__(3, "A"), "owned|busy"),            # stray owner
    (lambda st: st.cluster.owner[0].__setitem__(1, "B"), "owned by B"),            # GPU of A given to B
    (lambda st: setattr(st.jobs["B"], "alloc", Allocation(grid("a100", 1, 2), ((0, 0), (0, 3)))), "held by both|owned"),
    (lambda st: st.cluster.free_count.__setitem__(0, 3), "free"),                  # capacity count broken
    (lambda st: st.queued.pop("C"), "submitted"),                                  # job lost
    (lambda st: setattr(st.jobs["A"], "alloc", Allocation(grid("a100", 2, 1), ((0, 0), (0, 1)))), "shape"),
    (lambda st: setattr(st.jobs["C"], "status", JobStatus.RUNNING), "queue"),
])
def test_corruption_trips_invariants(corrupt, match):
    st = _state()
    corrupt(st)
    with pytest.raises(InvariantViolation, match=match):
        check_invariants(st, 0.0, None)


def test_clock_and_iterations_are_monotone():
    st = _state()
    with pytest.raises(InvariantViolation, match="clock"):
        check_invariants(st, 100.0, 200.0)
    st.jobs["A"].iterations_done = 2.0
    with pytest.raises(InvariantViolation, match="iterations"):
        check_invariants(st, 300.0, 0.0, {"A": 5.0})
    with pytest.raises(StateError):
        st.set_progress("A", 1.0)


def test_engine_methods_refuse_double_booking():
    st = _state()
    with pytest.raises(StateError, match="already held"):
        st.start("C", Allocation(grid("a100", 1, 1), ((0, 0),)), 0.0)
    with pytest.raises(StateError):
        st.submit("A", 0.0)
    with pytest.raises(StateError):
        st.set_time(-1.0) if st.set_time(10.0) is None else None


def test_nonexistent_gpu_trips():
    st = _state()
    st.jobs["A"].alloc = Allocation(grid("a100", 1, 2), ((0, 0), (0, 9)))
    with pytest.raises(InvariantViolation, match="non-existent"):
        check_invariants(st, 0.0, None)


def test_a_run_refused_on_its_shape_is_not_a_failure():
    from engine.core.allocation import Allocation
    from instances.grid import Grid, Shape
    st = EngineState(cluster(("a100", 2, 4)), [job("A", 0.0, 10)])
    st.submit("A", 0.0)
    grid = Grid(Shape("a100", 1, 4))
    st.start("A", Allocation(grid, tuple((0, i) for i in range(4))), 1.0)
    st.fail_run("A", 2.0, 0.0, "launch refused: does not fit", max_failures=1, infeasible_shape=True)
    r = st.jobs["A"]
    assert r.status is JobStatus.QUEUED and r.failures == 0 and grid.shape in r.known_infeasible
    assert r.retry_after_s < 2.0                                   # offered again at once
    st.start("A", Allocation(Grid(Shape("a100", 1, 2)), ((1, 0), (1, 1))), 3.0)
    st.fail_run("A", 4.0, 0.0, "rank died", max_failures=1)
    assert st.jobs["A"].status is JobStatus.FAILED and st.failed_ids == ["A"]
