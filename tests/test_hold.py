"""A user's hand on a live job, in the engine: holding and releasing it (``arena hold`` /
``arena release``: a held job leaves the queue (a running one its GPUs, keeping its
progress), is never offered to the policy, and is not a preemption; released, it is
queued again and resumes from what it kept) and changing its priority (``arena
priority``: the next round decides with it), and a job that waits for others (``after``).
The live side (store, API, a real service)
is in test_service_store.py, test_service_api.py and test_service_failures.py."""
from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.policy import make_policy
from engine.core.reconfig import ReconfigCostModel
from engine.core.round_loop import RoundLoop
from engine.core.state import JobStatus, StateError
from engine.sim.sim_executor import SimExecutor
from instances.builtin import get_instance

DEMO = get_instance("demo")
INTERVAL = 300.0


@functools.cache
def _analytic():
    """One analytic model for every test here (it is pure; its estimates are cached)."""
    from estimators import make_performance_model
    return make_performance_model("analytic")


def _loop(n_jobs: int, policy: str = "fcfs") -> RoundLoop:
    perf = None if policy == "fcfs" else _analytic()
    loop = RoundLoop(DEMO.cluster, make_policy(policy), SimExecutor(DEMO.oracle, ReconfigCostModel()), perf=perf,
                     round_interval_s=INTERVAL, jobs=DEMO.jobs[:n_jobs])
    for j in DEMO.jobs[:n_jobs]:
        loop.submit(j.job_id, 0.0)
    loop.round(0.0, 0)
    return loop


def _step(loop: RoundLoop, k: int) -> None:
    now = k * INTERVAL
    loop.collect(now)
    loop.round(now, k)


def test_a_held_running_job_frees_its_gpus_keeps_its_progress_and_resumes_when_released():
    loop = _loop(4)
    st_ = loop.state
    jid = next(iter(st_.running))
    for k in range(1, 4):
        _step(loop, k)
    done = loop.executor.progress(jid).iterations_done
    assert 0 < done < st_.jobs[jid].job.num_iterations
    loop.hold(jid, 3 * INTERVAL)
    r = st_.jobs[jid]
    assert r.status is JobStatus.HELD and r.alloc is None and jid in st_.held
    assert jid not in st_.running and jid not in st_.queued
    assert all(jid not in row for row in st_.cluster.owner)         # its GPUs are free
    assert r.iterations_done == done                                  # what it had (the simulator keeps all)
    assert r.preemptions == 0 and r.changes_total == 0                # the user's decision, not a change
    for k in range(4, 8):                                             # never offered to the policy
        _step(loop, k)
        assert st_.jobs[jid].status is JobStatus.HELD and st_.jobs[jid].iterations_done == done
        assert jid not in {v.job_id for v in loop.context(k * INTERVAL, k).jobs}
    loop.release(jid, 7.5 * INTERVAL)
    assert st_.jobs[jid].status is JobStatus.QUEUED and jid in st_.queued
    for k in range(8, 400):
        _step(loop, k)
        if st_.jobs[jid].status is JobStatus.FINISHED:
            break
    r = st_.jobs[jid]
    assert r.status is JobStatus.FINISHED and r.iterations_done == r.job.num_iterations
    assert r.lost_iterations == 0                                      # it resumed where it was held


def test_a_held_queued_job_can_be_cancelled_and_bad_transitions_are_refused():
    loop = _loop(40)
    st_ = loop.state
    queued = next(iter(st_.queued))
    loop.hold(queued, 10.0)
    with pytest.raises(StateError, match="held while held"):
        loop.hold(queued, 11.0)
    loop.cancel(queued, 12.0)
    assert st_.jobs[queued].status is JobStatus.FAILED and queued in st_.failed_ids and queued not in st_.held
    with pytest.raises(StateError, match="released while failed"):
        loop.release(queued, 13.0)
    running = next(iter(st_.running))
    with pytest.raises(StateError, match="released while running"):
        loop.release(running, 13.0)
    _step(loop, 1)                                                     # invariants hold after it all


ACTIONS = st.lists(st.tuples(st.integers(1, 11), st.sampled_from(["hold", "release", "cancel"]),
                             st.integers(0, 7)), max_size=12)


@settings(max_examples=25, deadline=None)
@given(ACTIONS, st.sampled_from(["fcfs", "sia-ap"]))
def test_random_holds_releases_and_cancels_keep_every_invariant_and_lose_no_progress(actions, policy):
    """Users hold, release and cancel jobs at random between rounds; the loop asserts its
    invariants every round. A held job never runs and its progress never moves; a job's
    progress never goes back; every job is accounted for."""
    loop = _loop(8, policy)
    st_ = loop.state
    ids = [j.job_id for j in DEMO.jobs[:8]]
    progress = {j: 0.0 for j in ids}
    for k in range(1, 13):
        _step(loop, k)
        for j in ids:
            r = st_.jobs[j]
            assert r.iterations_done >= progress[j] - 1e-9, j
            if r.status is JobStatus.HELD:
                assert r.alloc is None and r.iterations_done == progress[j]
            progress[j] = r.iterations_done
        now = k * INTERVAL + 1.0
        for when, what, idx in actions:
            if when != k:
                continue
            jid, status = ids[idx], st_.jobs[ids[idx]].status
            allowed = {"hold": (JobStatus.QUEUED, JobStatus.RUNNING), "release": (JobStatus.HELD,),
                       "cancel": (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.HELD)}[what]
            if status not in allowed:
                continue
            getattr(loop, what)(jid, now)
            progress[jid] = st_.jobs[jid].iterations_done
        held = {j for j in ids if st_.jobs[j].status is JobStatus.HELD}
        assert held == set(st_.held)
    counted = len(st_.queued) + len(st_.running) + len(st_.held) + len(st_.finished_ids) + len(st_.failed_ids)
    assert counted == len(ids)


def test_a_restarted_service_leaves_a_held_job_held_and_takes_it_back_once_released(tmp_path):
    """The service side without launching anything: a job held in the store is not
    adopted at recovery (so it stays held across restarts) and becomes an admission once
    released; a hold requested before the restart is still carried out after it."""
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    from instances.cluster import ClusterSpec, NodeGroup
    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")
    spec = JobSpec("j", "tiny-gpt__2L", 8, 20)
    with Store(db) as s:
        held, pending = s.jobs.submit(spec), s.jobs.submit(spec)
        s.jobs.request_hold(held, "look at it later")
        assert s.jobs.hold(held)
        s.jobs.request_hold(pending, "")                    # requested; the service died before carrying it out
    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=db, work_dir=work), log=lambda m: None)
    try:
        svc.recover()
        assert str(held) not in svc.loop.state.jobs and str(pending) in svc.loop.state.jobs
        assert svc.store.jobs.get(held).status == "held" and [r.id for r in svc.admissions()] == []
        svc.carry_out_holds(1.0)
        assert svc.store.jobs.get(pending).status == "held"
        assert svc.loop.state.jobs[str(pending)].status is JobStatus.HELD
        assert svc.store.jobs.release(held) == "released" and svc.store.jobs.release(pending) == "released"
        assert sorted(r.id for r in svc.admissions()) == [held, pending]   # new to the loop, and held in it
    finally:
        svc.shutdown()


def test_a_raised_priority_decides_which_of_two_jobs_gets_the_only_gpu():
    """One GPU, two identical jobs queued at once: ``sia-ap`` (whose throughput term weighs
    a job by its priority) places whichever has the higher priority; ``fcfs`` ignores it."""
    from tests.test_engine_helpers import LinearOracle, cluster, job

    def placed(policy: str, raise_: str | None) -> set[str]:
        perf = None if policy == "fcfs" else _analytic()
        jobs = [job("A", 0.0, 10_000), job("B", 0.0, 10_000)]
        loop = RoundLoop(cluster(("a100", 1, 1)), make_policy(policy), SimExecutor(LinearOracle(), ReconfigCostModel()),
                         perf=perf, round_interval_s=INTERVAL, jobs=jobs)
        for j in jobs:
            loop.submit(j.job_id, 0.0)
        if raise_ is not None:
            loop.set_priority(raise_, 5.0)
            assert loop.state.jobs[raise_].job.priority == 5.0
        loop.round(0.0, 0)
        return set(loop.state.running)

    assert placed("sia-ap", "A") == {"A"} and placed("sia-ap", "B") == {"B"}
    assert placed("fcfs", "B") == placed("fcfs", None) == {"A"}


def test_the_service_hands_a_priority_set_in_the_store_to_the_loop(tmp_path):
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    from instances.cluster import ClusterSpec, NodeGroup
    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")
    with Store(db) as s:
        before = s.jobs.submit(JobSpec("j", "tiny-gpt__2L", 8, 20))
        after = s.jobs.submit(JobSpec("k", "tiny-gpt__2L", 8, 20))
        s.jobs.set_priority(before, 2.0)                     # before a restart: the adopted job has it
    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=db, work_dir=work), log=lambda m: None)
    try:
        svc.recover()
        assert svc.loop.state.jobs[str(before)].job.priority == 2.0
        svc.store.jobs.set_priority(after, 7.0)               # while it runs: at the next round
        svc.sync_priorities()
        assert svc.loop.state.jobs[str(after)].job.priority == 7.0
    finally:
        svc.shutdown()


def test_a_job_after_others_waits_for_them_and_fails_when_one_cannot_finish(tmp_path):
    """A job submitted ``after`` others is not handed to the loop (at recovery nor as an
    admission) until they have all finished; when one fails or is cancelled it fails too."""
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    from instances.cluster import ClusterSpec, NodeGroup
    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")

    def spec(name, *after):
        return JobSpec(name, "tiny-gpt__2L", 8, 20, after=after)
    with Store(db) as s:
        a, b = s.jobs.submit(spec("a")), s.jobs.submit(spec("b"))
        c = s.jobs.submit(spec("c", a, b))                  # after both
        d = s.jobs.submit(spec("d", b))
    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=db, work_dir=work), log=lambda m: None)
    try:
        svc.recover()
        assert set(svc.loop.state.jobs) == {str(a), str(b)}       # c and d wait
        assert svc.admissions() == []
        svc.store.jobs.set_status(a, "finished", "test")
        assert svc.admissions() == []                           # c still waits for b
        svc.store.jobs.request_cancel(b)
        svc.store.jobs.set_status(b, "cancelled", "test")
        svc.end_orphans()
        for j in (c, d):
            assert svc.store.jobs.get(j).status == "failed"
            assert svc.store.jobs.history(j)[-1].reason == f"job {b}, which it was to run after, is cancelled"
        e = svc.store.jobs.submit(spec("e", a))                 # after a finished job: ready at once
        assert [r.id for r in svc.admissions()] == [e] and svc.store.check() == []
    finally:
        svc.shutdown()
