"""Failed runs counted per node (engine/service/node_health.py): a node is flagged once runs
of ``threshold`` different jobs failed on it within the window, once until cleared."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.service.node_health import NodeHealth


def test_different_jobs_within_the_window_flag_a_node_once():
    h = NodeHealth(3, 100.0)
    assert h.record([0], "1", 0.0) == []
    assert h.record([0], "1", 1.0) == []              # the same job again: still one job
    assert h.record([0, 1], "2", 2.0) == []           # a run on two nodes counts on each
    assert h.record([0], "3", 3.0) == [0]
    assert h.jobs(0) == ["1", "2", "3"] and h.jobs(1) == ["2"]
    assert h.record([0], "4", 4.0) == []              # flagged once ...
    h.cleared(0)
    assert h.jobs(0) == [] and h.record([0], "5", 5.0) == []     # ... until it is back in service


def test_failures_older_than_the_window_are_forgotten_and_zero_switches_it_off():
    h = NodeHealth(2, 10.0)
    assert h.record([4], "a", 0.0) == []
    assert h.record([4], "b", 20.0) == []             # "a" was 20 s ago: outside the window
    assert h.record([4], "c", 25.0) == [4]
    assert h.counts(25.0) == {4: 2} and h.counts(31.0) == {4: 1} and h.counts(40.0) == {}   # /metrics' view
    off = NodeHealth(0, 10.0)
    assert all(off.record([0], str(j), float(j)) == [] for j in range(10))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            NodeHealth(bad, 10.0)                     # type: ignore[arg-type]
    with pytest.raises(ValueError):
        NodeHealth(2, 0.0)


@settings(max_examples=60, deadline=None)
@given(threshold=st.integers(1, 4), window=st.floats(1.0, 50.0),
       events=st.lists(st.tuples(st.floats(0.0, 5.0), st.lists(st.integers(0, 3), min_size=1, max_size=2),
                                 st.integers(0, 5)), max_size=40))
def test_a_node_is_flagged_exactly_when_enough_different_jobs_failed_within_the_window(threshold, window, events):
    """Against the rule written plainly: at each failure, the distinct jobs among the
    failures on that node in the last ``window`` seconds; flagged the first time they reach
    the threshold, never again."""
    h = NodeHealth(threshold, window)
    t, seen, flagged = 0.0, [], set()
    for dt, nodes, job in events:
        t += dt
        got = h.record(nodes, str(job), t)
        seen.append((t, set(nodes), str(job)))
        want = []
        for node in sorted(set(nodes)):
            jobs = {j for at, ns, j in seen if node in ns and at >= t - window}
            if node not in flagged and len(jobs) >= threshold:
                flagged.add(node)
                want.append(node)
        assert got == want


def test_failures_counted_before_a_restart_count_on_after_it(tmp_path):
    """The service side without launching anything: a failed run counted on node 1 is in
    the store; after a restart a second job's failure there drains it, naming both; one
    older than the window is not counted; returned to service, the node's count is
    cleared in the store too."""
    import time

    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    from instances.cluster import ClusterSpec, NodeGroup
    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")
    with Store(db) as s:
        a, b, c = (s.jobs.submit(JobSpec(n, "tiny-gpt__2L", 8, 20)) for n in "abc")
    cfg = ServiceConfig(db_path=db, work_dir=work, drain_after_failures=2, failure_window_s=600.0)

    def service() -> Service:
        svc = Service(ClusterSpec((NodeGroup("cpu", 2, 1),), "two"), make_policy("fcfs"), None, ReconfigCostModel(),
                      cfg, log=lambda m: None)
        svc.recover()
        return svc

    now = time.time()
    svc = service()
    try:
        svc.count_node_failure(str(c), (1,), now - 700.0)       # outside the window by the restart
        svc.count_node_failure(str(a), (1,), now - 10.0)
        assert svc.store.nodes.drained() == {} and svc.node_failures() == {1: 1}
    finally:
        svc.shutdown()
    svc = service()                                               # the restart
    try:
        assert svc.node_failures() == {1: 1} and svc.store.nodes.drained() == {}
        svc.count_node_failure(str(b), (1,), now)
        reason = svc.store.nodes.drained()[1][0]
        assert reason.startswith("auto: runs of 2 jobs failed on it") and f"jobs {a}, {b}" in reason
        svc.apply_drains(now)                                     # the next round takes it out of service
        assert svc.loop.state.cluster.unavailable == {1}
        svc.store.nodes.undrain(1)                                       # `arena undrain 1`
        svc.apply_drains(now)
        assert svc.node_failures() == {} and svc.store.nodes.failures(since=0.0) == []
    finally:
        svc.shutdown()
    svc = service()
    try:
        assert svc.node_failures() == {}
    finally:
        svc.shutdown()


def test_a_node_at_the_threshold_when_the_service_died_is_drained_at_recovery(tmp_path):
    """Two different jobs' failures on node 1 were stored, and the service died before it
    drained the node: the recovery drains it (naming both); node 0 has one and stays."""
    import time

    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    from instances.cluster import ClusterSpec, NodeGroup
    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")
    now = time.time()
    with Store(db) as s:
        a, b = (s.jobs.submit(JobSpec(n, "tiny-gpt__2L", 8, 20)) for n in "ab")
        s.nodes.record_failure([1], a, now - 20.0, forget_before=now - 600.0)
        s.nodes.record_failure([0, 1], b, now - 10.0, forget_before=now - 600.0)   # a run on both nodes
    cfg = ServiceConfig(db_path=db, work_dir=work, drain_after_failures=2, failure_window_s=600.0)
    svc = Service(ClusterSpec((NodeGroup("cpu", 2, 1),), "two"), make_policy("fcfs"), None, ReconfigCostModel(),
                  cfg, log=lambda m: None)
    try:
        svc.recover()
        drained = svc.store.nodes.drained()
        assert set(drained) == {1} and f"jobs {a}, {b}" in drained[1][0]
        assert svc.node_failures() == {0: 1, 1: 2}
    finally:
        svc.shutdown()
