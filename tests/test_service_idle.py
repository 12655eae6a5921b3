"""The scheduler's idle check (``Service.due``, every poll between rounds): it reads
the store's queue, cancel and hold requests and drains only after another connection
(the API's, a command's) committed to the store, or after a round; each kind of request
committed elsewhere is still noticed at the next poll; a failed job's backoff ends a wait
without reading the queue. With 10,000 queued jobs the check read every queued id at
every poll (docs/results/2026-12-04-service-round-scale.md)."""
from __future__ import annotations

import time

import pytest

from engine.core.policy import make_policy
from engine.core.reconfig import ReconfigCostModel
from engine.service.daemon import Service, ServiceConfig
from engine.service.jobspec import JobSpec
from engine.service.store import Store
from instances.cluster import ClusterSpec, NodeGroup

SPEC = JobSpec("j", "tiny-gpt__2L", 8, 20)
REQUEST = "submission, cancel, hold or release"


@pytest.fixture
def idle(tmp_path):
    """A recovered service with three queued jobs (nothing launched), between rounds, and
    a count of its reads of the queue."""
    db, work = str(tmp_path / "state.db"), str(tmp_path / "work")
    with Store(db) as s:
        ids = [s.jobs.submit(SPEC) for _ in range(3)]
        s.jobs.request_hold(ids[2], "")
        assert s.jobs.hold(ids[2])                          # held before the start: not adopted
    svc = Service(ClusterSpec((NodeGroup("cpu", 2, 1),), "local-2x1"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=db, work_dir=work), log=lambda m: None)
    svc.recover()
    reads: list[str] = []
    real = svc.store.jobs.ids
    svc.store.jobs.ids = lambda status: reads.append(status) or real(status)      # type: ignore[method-assign]
    now = time.time()
    svc.close_round(now - svc.cfg.min_round_gap_s)                # a round just past its gap
    try:
        yield svc, db, ids, reads, now
    finally:
        svc.shutdown()


def test_the_idle_check_reads_the_queue_once_and_then_only_after_the_store_changed(idle):
    svc, db, ids, reads, now = idle
    assert not svc.due(now) and reads == ["queued"]           # looked once: nothing to act on
    for _ in range(3):
        assert not svc.due(now)
    assert reads == ["queued"]                                 # nothing committed since: not read again
    svc.close_round(now - svc.cfg.min_round_gap_s)             # as after a round (it wrote to the store)
    assert not svc.due(now) and reads == ["queued", "queued"]


@pytest.mark.parametrize("change, trigger", [
    (lambda s, ids: s.jobs.submit(SPEC), REQUEST),
    (lambda s, ids: s.jobs.request_cancel(ids[0]), REQUEST),
    (lambda s, ids: s.jobs.request_hold(ids[1], "later"), REQUEST),
    (lambda s, ids: s.jobs.release(ids[2]), REQUEST),
    (lambda s, ids: s.nodes.drain(1, "maintenance"), "node drained or returned"),
], ids=["submit", "cancel", "hold", "release", "drain"])
def test_a_request_committed_by_another_connection_is_noticed_at_the_next_poll(idle, change, trigger):
    svc, db, ids, reads, now = idle
    assert not svc.due(now)
    with Store(db) as api:                                     # the API's own connection
        change(api, ids)
    assert svc.due(now) and svc.trigger == trigger


def test_a_failed_jobs_backoff_ends_the_wait_without_reading_the_queue(idle):
    svc, db, ids, reads, now = idle
    assert not svc.due(now)
    svc.loop.state.queued[str(ids[0])].retry_after_s = now + 5.0    # as a failed run leaves it
    svc.close_round(now - svc.cfg.min_round_gap_s)             # the round that failed it (finds the backoff end)
    assert not svc.due(now + 1.0) and reads == ["queued", "queued"]     # the look after that round
    assert svc.due(now + 6.0) and svc.trigger == "a failed job's backoff ended"
    assert reads == ["queued", "queued"]                       # the backoff's end, without reading the queue
