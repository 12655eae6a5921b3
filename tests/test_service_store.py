"""The service's SQLite state store: status transitions, launch generations, one active
launch per GPU, schema migration from v1, readers in another process, and a writer
process killed by SIGKILL mid-write leaving a consistent database."""
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine.service.jobspec import JobSpec
from engine.service.store import MIGRATIONS, SCHEMA_VERSION, StaleGeneration, StateConflict, Store, migrate
from instances.errors import InputError

REPO = Path(__file__).resolve().parent.parent
SPEC = JobSpec("j", "tiny-gpt__2L", 8, 20)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        self.t += 1.0
        return self.t


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "state.db", clock=Clock()) as s:
        yield s


def launch(store, job, gpus=("n0:0",)):
    g = store.launches.record_intent(job, {"plan": "dp=1,tp=1,pp=1"}, list(gpus))
    store.launches.mark(job, g, "started", pid_info={"mpiexec_pid": 123, "host": "h"})
    return g


def test_fresh_database_is_wal_and_current(store):
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)


def test_job_lifecycle_and_history(store):
    j = store.jobs.submit(SPEC)
    assert store.jobs.get(j).status == "queued" and store.jobs.get(j).spec == SPEC.to_dict()
    assert JobSpec.from_dict(store.jobs.get(j).spec) == SPEC
    with pytest.raises(StateConflict, match="started launch"):
        store.jobs.set_status(j, "running", "no launch yet")
    g = launch(store, j)
    store.jobs.set_status(j, "running", "launched")
    with pytest.raises(StateConflict, match="still started"):
        store.jobs.set_status(j, "finished", "launch not ended")
    store.launches.mark(j, g, "finished", reason="exit 0")
    store.jobs.set_status(j, "finished", "all steps done")
    for bad in ("running", "queued", "cancelled"):
        with pytest.raises(StateConflict, match="not allowed"):
            store.jobs.set_status(j, bad, "after the end")
    with pytest.raises(StateConflict):
        store.launches.record_intent(j, {}, ["n0:0"])
    assert [(h.from_status, h.to_status, h.reason) for h in store.jobs.history(j)] == [
        (None, "queued", "submitted"), ("queued", "running", "launched"), ("running", "finished", "all steps done")]
    ats = [h.at for h in store.jobs.history(j)]
    assert ats == sorted(ats)
    with pytest.raises(InputError, match="unknown status"):
        store.jobs.set_status(j, "paused", "x")
    with pytest.raises(InputError, match="no job"):
        store.jobs.set_status(99, "cancelled", "x")
    assert store.check() == []


def test_generations_are_monotonic_and_old_ones_are_refused(store):
    j = store.jobs.submit(SPEC)
    g1 = launch(store, j)
    store.jobs.set_status(j, "running", "launched")
    store.launches.record_checkpoint(j, g1, 10, "/ck/step_10")
    store.launches.record_checkpoint(j, g1, 10, "/ck/step_10")                 # a repeated report: no-op
    with pytest.raises(StateConflict, match="already saved"):
        store.launches.record_checkpoint(j, g1, 10, "/elsewhere")
    with pytest.raises(StateConflict, match="still started"):
        store.launches.record_intent(j, {}, ["n0:1"])                  # one active launch per job
    store.launches.mark(j, g1, "finished", reason="moved")              # a move: stop, then relaunch
    g2 = launch(store, j, ["n0:0", "n0:1"])
    assert (g1, g2) == (1, 2)
    with pytest.raises(StaleGeneration):
        store.launches.mark(j, g1, "failed", reason="late exit message")
    with pytest.raises(StaleGeneration):
        store.launches.record_checkpoint(j, g1, 12, "/ck/step_12")
    with pytest.raises(InputError, match="no launch 3"):
        store.launches.mark(j, 3, "started")
    store.launches.record_measurement(j, g1, reconfig={"stop_s": 1.5, "checkpoint_s": 0.5})   # a launch's own figure
    store.launches.record_measurement(j, g2, iteration_time_s=0.25, step=11)
    with pytest.raises(StateConflict, match="not allowed"):
        store.launches.mark(j, g2, "intent")
    store.launches.mark(j, g2, "failed", reason="rank 1 killed")
    g3 = store.launches.record_intent(j, {}, ["n0:2"])
    store.launches.mark(j, g3, "failed", reason="never started")
    assert [(l.generation, l.state) for l in store.launches.rows(j)] == [(1, "finished"), (2, "failed"), (3, "failed")]
    assert [m.generation for m in store.launches.measurements(j)] == [1, 2]
    assert store.launches.latest_checkpoint(j).step == 10 and store.jobs.get(j).status == "running"
    store.jobs.set_status(j, "queued", "waiting for GPUs")
    assert store.check() == []


def test_a_gpu_is_in_one_active_launch_and_a_refused_intent_leaves_nothing(store):
    a, b = store.jobs.submit(SPEC), store.jobs.submit(SPEC)
    ga = launch(store, a, ["n0:0", "n0:1"])
    with pytest.raises(StateConflict, match=r"n0:1 \(job 1\)"):
        store.launches.record_intent(b, {}, ["n0:1", "n0:2"])
    assert store.launches.rows(b) == [] and store.launches.active()[0].gpus == ("n0:0", "n0:1")
    store.launches.mark(a, ga, "finished")
    assert store.launches.record_intent(b, {}, ["n0:1", "n0:2"]) == 1    # freed, and generation 1 unused before
    with pytest.raises(InputError, match="distinct"):
        store.launches.record_intent(a, {}, ["n1:0", "n1:0"])
    assert [(l.job_id, l.state) for l in store.launches.active()] == [(b, "intent")]
    assert store.check() == []


def test_rounds_and_bad_values(store):
    i1 = store.rounds.record(policy="arena", trigger="arrival", solve_time_s=0.12, objective=3.5, gap=0.0,
                            decisions={"1": {"grid": "a100:1x2:pp1"}})
    i2 = store.rounds.record(policy="arena", trigger="timer", solve_time_s=0.05, decisions={})
    assert (i1, i2) == (1, 2)
    assert [r.trigger for r in store.rounds.rows()] == ["arrival", "timer"] and store.rounds.rows(last=1)[0].idx == 2
    with pytest.raises(InputError, match="finite"):
        store.rounds.record(policy="arena", trigger="t", solve_time_s=float("nan"), decisions={})
    with pytest.raises(InputError, match="JSON"):
        store.rounds.record(policy="arena", trigger="t", solve_time_s=1.0, decisions={"x": object()})
    assert len(store.rounds.rows()) == 2


def shadow_round(policy, jobs, agree, error=None):
    from engine.core.shadow import JobDiff, ShadowComparison
    differ = tuple(JobDiff(str(i), "cpu:1x1:pp1", None, None) for i in range(jobs - agree))
    return {"grids": {}, "shadow": ShadowComparison(policy, jobs, agree, differ, len(differ), (1, 1), (1, 1),
                                                    (0, 0), None, 0.01, error=error).to_dict()}


OLD_SHADOW_QUERY = (          # how v7 counted, over every round's decisions
    "SELECT json_extract(decisions, '$.shadow.policy') AS p, COUNT(*), "
    "COALESCE(SUM(json_extract(decisions, '$.shadow.all_agree')), 0), "
    "COALESCE(SUM(json_extract(decisions, '$.shadow.error') IS NOT NULL), 0), "
    "COALESCE(SUM(CASE WHEN json_extract(decisions, '$.shadow.error') IS NULL "
    "THEN json_extract(decisions, '$.shadow.jobs') ELSE 0 END), 0), "
    "COALESCE(SUM(json_extract(decisions, '$.shadow.disagreements')), 0) "
    "FROM rounds WHERE p IS NOT NULL GROUP BY p ORDER BY p")


def test_v8_counts_the_rounds_a_v7_database_holds_as_v7_did_and_keeps_counting(tmp_path):
    path = tmp_path / "v7.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=7)
    rng = random.Random(3)
    rounds = [{"grids": {}}] + [shadow_round(rng.choice(["sia-ap", "fcfs"]), j, rng.randint(0, j),
                                             rng.choice([None, None, "ValueError: x"]))
                                for j in (rng.randint(0, 5) for _ in range(40))]
    for d in rounds:
        conn.execute("INSERT INTO rounds(at, policy, trigger, solve_time_s, decisions) "
                     "VALUES (1, 'arena', 't', 0.1, ?)", (json.dumps(d),))
    v7 = {p: dict(zip(("rounds", "agreeing", "failed", "jobs", "disagreeing"), rest))
          for p, *rest in conn.execute(OLD_SHADOW_QUERY)}
    conn.close()
    with Store(path) as s:
        assert s.rounds.shadow_counts() == v7 and set(v7) == {"sia-ap", "fcfs"}
        more = [shadow_round("sia-ap", 3, 1), shadow_round("fcfs", 2, 2, "E"), {"grids": {}}]
        for d in more:
            s.rounds.record(policy="arena", trigger="t", solve_time_s=0.1, decisions=d)
        both = {p: dict(zip(("rounds", "agreeing", "failed", "jobs", "disagreeing"), rest))
                for p, *rest in s.conn.execute(OLD_SHADOW_QUERY)}
        assert s.rounds.shadow_counts() == both and both["sia-ap"]["rounds"] == v7["sia-ap"]["rounds"] + 1


def test_old_rounds_are_deleted_beyond_keep_and_the_shadow_totals_stay_whole(store):
    for i in range(12):
        store.rounds.record(policy="arena", trigger="t", solve_time_s=0.1, decisions=shadow_round("sia-ap", 2, i % 3),
                           keep=5)
    assert [r.idx for r in store.rounds.rows()] == list(range(8, 13))        # the last 5, numbered on
    assert store.rounds.shadow_counts() == {"sia-ap": {"rounds": 12, "agreeing": 4, "failed": 0, "jobs": 24,
                                                "disagreeing": 12}}
    store.rounds.record(policy="arena", trigger="t", solve_time_s=0.1, decisions={})       # keep=0: nothing deleted
    assert len(store.rounds.rows()) == 6 and store.check() == []
    for bad in (-1, 1.5, True):
        with pytest.raises(InputError) as e:
            store.rounds.record(policy="arena", trigger="t", solve_time_s=0.1, decisions={}, keep=bad)
        assert e.value.field == "keep_rounds"
    assert len(store.rounds.rows()) == 6


def test_a_job_keeps_its_newest_iteration_times_and_every_measured_move(store):
    a, b = (store.jobs.submit(JobSpec.from_dict({"name": n, "model": "tiny-gpt__2L", "global_batch": 8, "steps": 9}))
            for n in ("a", "b"))
    ga, gb = launch(store, a, ["n0:0"]), launch(store, b, ["n0:1"])
    for i in range(8):
        store.launches.record_measurement(a, ga, iteration_time_s=0.1 + i, step=i, keep=3)
        store.launches.record_measurement(b, gb, iteration_time_s=0.1, step=i)               # keep=0: every one kept
        if i == 2:
            store.launches.record_measurement(a, ga, reconfig={"stop_s": 1.0}, keep=3)     # a measured move: kept
    got = store.launches.measurements(a)
    assert [m.step for m in got if not m.reconfig] == [5, 6, 7] and [m.reconfig for m in got if m.reconfig] == [
        {"stop_s": 1.0}]
    assert len(store.launches.measurements(b)) == 8 and store.check() == []
    for bad in (-1, 2.5, True):
        with pytest.raises(InputError) as e:
            store.launches.record_measurement(a, ga, iteration_time_s=0.1, keep=bad)
        assert e.value.field == "keep_measurements"
    assert len(store.launches.measurements(a)) == 4


def test_migration_from_v1_keeps_the_data(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=1)                               # what version 1 of the code created
    conn.execute("INSERT INTO jobs(name, spec, status, submitted_at, updated_at) VALUES ('old', ?, 'running', 1, 2)",
                 (json.dumps(SPEC.to_dict()),))
    conn.execute("INSERT INTO job_history(job_id, from_status, to_status, reason, at) VALUES "
                 "(1, NULL, 'queued', 'submitted', 1), (1, 'queued', 'running', 'launched', 2)")
    conn.execute("INSERT INTO launches(job_id, generation, plan, state, created_at, updated_at) "
                 "VALUES (1, 1, '{}', 'started', 1, 2)")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    with Store(path) as s:
        assert s.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert s.jobs.get(1).status == "running" and s.launches.active()[0].generation == 1
        s.launches.record_checkpoint(1, 1, 5, "/ck/5")             # v2 tables work on the migrated data
        s.launches.mark(1, 1, "finished")
        assert s.jobs.submit_once(SPEC, "k")[0] == s.jobs.submit_once(SPEC, "k")[0] == 2   # v4's keys on old data
        assert s.check() == []
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match="newer"):
        Store(path)


def test_not_a_database(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputError, match="not a usable SQLite"):
        Store(junk)
    with pytest.raises(InputError, match="folder"):
        Store(tmp_path)
    with pytest.raises(InputError, match="no state database"):
        Store(tmp_path / "absent.db", readonly=True)


READER = textwrap.dedent("""
    import json, sys
    from engine.service.store import Store
    with Store(sys.argv[1], readonly=True) as s:
        print(json.dumps([[j.id, j.status] for j in s.jobs.rows()]))
""")


def test_a_reader_in_another_process_sees_committed_state_while_the_writer_holds_a_transaction(store):
    j = store.jobs.submit(SPEC)
    store.conn.execute("BEGIN IMMEDIATE")                 # the writer is mid-transaction ...
    store.conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = ?", (j,))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", READER, str(store.path)], capture_output=True, text=True,
                         env=env, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[j, "queued"]]      # ... the reader is not blocked, sees the committed
    assert time.perf_counter() - t0 < 30
    store.conn.execute("ROLLBACK")
    reader = Store(store.path, readonly=True)
    with pytest.raises(StateConflict, match="read-only"):
        reader.jobs.submit(SPEC)
    store.jobs.set_status(j, "cancelled", "by user")
    assert reader.jobs.get(j).status == "cancelled"            # a second connection sees each commit
    reader.close()


# The writer: a workload of every kind of change, slowed inside SQLite (a progress handler
# that sleeps) so that a kill lands mid-transaction. "begin" before each change, "ok" with
# what it changed after its commit. On start it recovers like a restarted service: active
# launches are marked failed, running jobs requeued.
WRITER = textwrap.dedent("""
    import json, sys, time
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    s = Store(sys.argv[1])
    s.conn.set_progress_handler(lambda: time.sleep(0.0005), 20)
    def say(line):      # one write per line: with PYTHONUNBUFFERED, print's pieces are writes of their own
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()
    def op(kind, fn, *args, **kw):
        say(f"begin {kind}")
        out = fn(*args, **kw)
        say("ok " + json.dumps([kind, *args, out], default=lambda o: o.name))
        return out
    for l in s.launches.active():
        op("mark", s.launches.mark, l.job_id, l.generation, "failed", reason="service restarted")
    for j in s.jobs.rows("running"):
        op("status", s.jobs.set_status, j.id, "queued", "service restarted")
    say("ready")
    for n in range(10**6):
        j = op("submit", s.jobs.submit, JobSpec(f"j{n}", "tiny-gpt__2L", 8, 20))
        g = op("intent", s.launches.record_intent, j, {"n": n}, [f"n0:{n % 4}", f"n1:{n % 4}"])
        op("mark", s.launches.mark, j, g, "started", pid_info={"pid": n})
        op("status", s.jobs.set_status, j, "running", "launched")
        op("measure", s.launches.record_measurement, j, g, iteration_time_s=0.1, step=1)
        op("ckpt", s.launches.record_checkpoint, j, g, 1, f"/ck/{j}")
        op("round", s.rounds.record, policy="arena", trigger="timer", solve_time_s=0.01, decisions={"j": j})
        op("mark", s.launches.mark, j, g, "finished")
        op("status", s.jobs.set_status, j, "finished", "done")
""")
LAUNCH_ORDER = ("intent", "started", "finished", "failed")


def committed_present(s: Store, kind, *args) -> bool:
    if kind == "submit":
        return s.jobs.get(args[-1]).name.startswith("j")
    if kind == "intent":
        return any(l.generation == args[-1] for l in s.launches.rows(args[0]))
    if kind == "mark":
        job, gen, state = args[:3]
        have = next(l.state for l in s.launches.rows(job) if l.generation == gen)
        return have == state or (state != "failed" and LAUNCH_ORDER.index(have) > LAUNCH_ORDER.index(state))
    if kind == "status":
        return any(h.to_status == args[1] and h.reason == args[2] for h in s.jobs.history(args[0]))
    if kind == "measure":
        return any(m.generation == args[1] for m in s.launches.measurements(args[0]))
    if kind == "ckpt":
        return any(c.generation == args[1] and c.step == args[2] for c in s.launches.checkpoints(args[0]))
    if kind == "round":
        return any(r.idx == args[-1] for r in s.rounds.rows())
    raise AssertionError(kind)


def test_sigkill_of_the_writer_mid_write_leaves_a_consistent_database(tmp_path):
    path = tmp_path / "state.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(7)
    committed, mid_op = [], 0
    for run in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                                env=env, cwd=REPO)
        lines = []
        while not lines or lines[-1] != "ready":
            line = proc.stdout.readline()
            assert line, f"writer exited early ({proc.wait()})"
            lines.append(line.strip())
        time.sleep(rng.uniform(0.2, 0.8))
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
        lines += rest.splitlines()
        mid_op += lines[-1].startswith("begin")
        committed += [json.loads(l[3:]) for l in lines if l.startswith("ok ")]
        with Store(path, readonly=True) as s:
            assert s.check() == [], f"after kill {run + 1}"
            missing = [c for c in committed if not committed_present(s, *c)]
            assert not missing, f"after kill {run + 1}: committed changes missing: {missing[:5]}"
    print(f"committed {len(committed)} changes, {mid_op} of 4 kills inside a change")
    assert len(committed) > 20
    assert mid_op >= 1, "no kill landed inside a change; the test did not test that"
    with Store(path) as s:                                 # and the writer can carry on
        assert s.check() == [] and s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# Random sequences of changes, valid or not: every change either commits or is refused
# with StateConflict / InputError and leaves the database exactly as it was; after each,
# the database is consistent.
GPUS = st.one_of(st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True),
                st.lists(st.sampled_from("ab"), max_size=3))           # mostly valid; sometimes empty/repeated
GEN = st.sampled_from(["latest", "latest", "latest", "older", 0, 9])   # resolved against the job's launches
MARK = st.tuples(st.just("mark"), st.integers(1, 2), GEN,
                 st.sampled_from(["started", "started", "finished", "failed", "intent", "gone"]))
STATUS = st.tuples(st.just("status"), st.integers(1, 2), st.sampled_from(["queued", "running", "running", "finished",
                                                                          "failed", "cancelled", "held", "bogus"]))
HOLD = st.tuples(st.sampled_from(["request_hold", "hold", "release"]), st.integers(1, 2))
PRIORITY = st.tuples(st.just("priority"), st.integers(1, 2), st.sampled_from([2.0, 0.5, 0.0, float("nan")]))
OPS = st.one_of(
    st.tuples(st.just("submit")),
    STATUS,
    st.tuples(st.just("intent"), st.integers(1, 2), GPUS),
    MARK, MARK, MARK, MARK, STATUS, HOLD, PRIORITY,
    st.tuples(st.just("ckpt"), st.integers(1, 2), GEN, st.integers(-1, 50)),
    st.tuples(st.just("measure"), st.integers(1, 2), GEN, st.floats(allow_nan=True)),
)


def _apply(s: Store, op) -> None:
    kind, *a = op
    if kind in ("mark", "ckpt", "measure") and isinstance(a[1], str):
        gens = [l.generation for l in s.launches.rows(a[0])] or [1]
        a[1] = gens[-1] if a[1] == "latest" else gens[0]
    if kind == "submit":
        s.jobs.submit(SPEC)
    elif kind == "status":
        s.jobs.set_status(a[0], a[1], "fuzz")
    elif kind == "intent":
        s.launches.record_intent(a[0], {}, a[1])
    elif kind == "mark":
        s.launches.mark(a[0], a[1], a[2])
    elif kind == "request_hold":
        s.jobs.request_hold(a[0], "fuzz")
    elif kind == "priority":
        s.jobs.set_priority(a[0], a[1])
    elif kind in ("hold", "release"):
        getattr(s.jobs, kind)(a[0])
    elif kind == "ckpt":
        s.launches.record_checkpoint(a[0], a[1], a[2], "/ck")
    else:
        s.launches.record_measurement(a[0], a[1], iteration_time_s=a[2])


@settings(max_examples=40, deadline=None)
@given(st.lists(OPS, min_size=10, max_size=50))
def test_fuzz_changes_commit_whole_or_leave_nothing(tmp_path_factory, ops):
    with Store(tmp_path_factory.mktemp("fz") / "s.db", clock=Clock()) as s:
        s.conn.execute("PRAGMA synchronous = OFF")         # speed: this tests logic, not durability
        s.jobs.submit(SPEC), s.jobs.submit(SPEC)
        for op in ops:
            before = list(s.conn.iterdump())
            try:
                _apply(s, op)
                event(f"committed {op[0]}")
            except (StateConflict, InputError):
                assert list(s.conn.iterdump()) == before, op
            assert s.check() == [], op


def test_hold_and_release_follow_the_state_machine_and_a_withdrawn_hold_is_not_carried_out(store):
    a, b = store.jobs.submit(SPEC), store.jobs.submit(SPEC)
    assert store.jobs.request_hold(a, "urgent run first") is True
    assert store.jobs.request_hold(a, "again") is False                  # the first reason is kept
    assert store.jobs.hold_requests() == [(a, "urgent run first")]
    assert store.jobs.hold(a) is True and store.jobs.get(a).status == "held" and store.jobs.hold_requests() == []
    assert store.jobs.history(a)[-1].reason == "held by the user: urgent run first"
    assert store.jobs.request_hold(a, "x") is False                      # already held
    assert store.jobs.release(a) == "released" and store.jobs.get(a).status == "queued"
    with pytest.raises(StateConflict, match="not held"):
        store.jobs.release(a)
    store.jobs.request_hold(b, "")                                        # requested, then withdrawn
    assert store.jobs.release(b) == "withdrawn" and store.jobs.hold(b) is False and store.jobs.get(b).status == "queued"
    g = launch(store, b)                                             # a running job is stopped first
    store.jobs.set_status(b, "running", "launched")
    store.jobs.request_hold(b, "")
    with pytest.raises(StateConflict, match="running -> held"):
        store.jobs.hold(b)
    store.launches.mark(b, g, "finished", reason="held by the user: stopped with a checkpoint at step 3")
    store.jobs.set_status(b, "queued", "held by the user (resumes from step 3)")
    assert store.jobs.hold(b) is True
    store.jobs.request_cancel(b)
    assert store.jobs.cancel_requests() == [b]                            # a held job can be cancelled
    store.jobs.set_status(b, "cancelled", "cancelled by the user")
    with pytest.raises(StateConflict, match="cancelled; only a queued or running job"):
        store.jobs.request_hold(b, "")
    with pytest.raises(InputError, match="no job 99"):
        store.jobs.request_hold(99, "")
    assert [h.to_status for h in store.jobs.history(b)] == ["queued", "running", "queued", "held", "cancelled"]
    assert [h.to_status for h in store.jobs.history(a)] == ["queued", "held", "queued"]
    assert store.check() == []


def test_a_priority_set_after_submission_is_read_back_noted_and_keeps_the_submission_key(store):
    j, _ = store.jobs.submit_once(SPEC, "k1")
    assert store.jobs.set_priority(j, 3, "deadline tomorrow") == 1.0
    assert store.jobs.get(j).spec["priority"] == 3.0 and store.jobs.rows()[0].spec["priority"] == 3.0
    assert store.jobs.priorities_set() == {j: 3.0}
    note = store.jobs.history(j)[-1]
    assert (note.from_status, note.to_status) == ("queued", "queued")
    assert note.reason == "priority 1 -> 3 by the user: deadline tomorrow"
    assert store.jobs.submit_once(SPEC, "k1") == (j, False)               # a resend still finds its job
    assert store.jobs.set_priority(j, 0.5) == 3.0 and store.check() == []
    before = list(store.conn.iterdump())
    for bad in (0, -1, float("nan"), float("inf"), "2", True, None, 1e308, 10**400, 1e-5):
        with pytest.raises(InputError, match=r"number in \[0.0001, 10000\]"):
            store.jobs.set_priority(j, bad)
    assert list(store.conn.iterdump()) == before                    # refused: nothing written
    store.jobs.request_cancel(j)
    store.jobs.set_status(j, "cancelled", "test")
    with pytest.raises(StateConflict, match="only a queued, running or held job's priority"):
        store.jobs.set_priority(j, 2)
    assert store.jobs.priorities_set() == {} and store.check() == []
    assert store.jobs.get(j).spec["priority"] == 0.5


def test_a_job_after_others_names_jobs_that_exist_and_can_still_finish(store):
    a, b = store.jobs.submit(SPEC), store.jobs.submit(SPEC)
    store.jobs.request_cancel(b)
    store.jobs.set_status(b, "cancelled", "test")
    after_a = JobSpec("later", SPEC.model, SPEC.global_batch, SPEC.steps, after=(a,))
    c = store.jobs.submit(after_a)
    assert store.jobs.get(c).spec["after"] == [a] and store.jobs.statuses([a, b, 99]) == {a: "queued", b: "cancelled"}
    before = list(store.conn.iterdump())
    for deps, says in (((99,), "no job 99 to run after"), ((a, b), f"job {b} is cancelled")):
        with pytest.raises(InputError, match=says) as e:
            store.jobs.submit(JobSpec("x", SPEC.model, SPEC.global_batch, SPEC.steps, after=deps))
        assert e.value.field == "after"
    assert list(store.conn.iterdump()) == before                    # refused: nothing stored


def test_statuses_of_more_ids_than_sqlite_takes_parameters(store):
    """The service asks once for every queued job's dependencies: possibly more ids than
    one statement takes (999 before SQLite 3.32, 32,766 since by default; builds differ,
    so the limit is set to the old one here)."""
    store.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    ids = [store.jobs.submit(SPEC) for _ in range(1001)]
    got = store.jobs.statuses(ids + list(range(5000, 7000)))               # 3,001 ids, 2,000 unknown
    assert got == dict.fromkeys(ids, "queued") and store.jobs.statuses([]) == {}
    store.jobs.request_cancel(ids[5])
    store.jobs.set_status(ids[5], "cancelled", "test")
    assert store.jobs.ids("queued") == ids[:5] + ids[6:] and store.jobs.ids("cancelled") == [ids[5]]
    rows = store.jobs.rows("queued", ids=ids[3:1000] + [99999])             # 997 ids: two statements
    assert [r.id for r in rows] == ids[3:5] + ids[6:1000] and store.jobs.rows(ids=[ids[5]])[0].status == "cancelled"
    assert store.jobs.rows("queued", ids=[]) == [] and len(store.jobs.rows()) == 1001


def test_a_keyed_submission_is_stored_once_and_a_reused_key_is_refused(store):
    assert store.jobs.submit_once(SPEC, "abc") == (1, True)
    assert store.jobs.submit_once(SPEC, "abc") == (1, False)         # sent again: the same job back
    assert store.jobs.submit_once(SPEC, None) == (2, True) and store.jobs.submit_once(SPEC, None) == (3, True)
    before = list(store.conn.iterdump())
    other = JobSpec("other", SPEC.model, SPEC.global_batch, SPEC.steps)
    with pytest.raises(StateConflict, match="'abc' was used for job 1"):
        store.jobs.submit_once(other, "abc")
    for bad in ("", "x" * 201, "a\nb", 7):
        with pytest.raises(InputError, match="idempotency key"):
            store.jobs.submit_once(SPEC, bad)
    assert list(store.conn.iterdump()) == before
    assert [h.to_status for h in store.jobs.history(1)] == ["queued"]  # the replay wrote no history


def test_the_move_ledger_is_stored_updated_closed_and_checked(store):
    from engine.cli.commands.service import move_line
    from engine.core.move_ledger import MoveEntry
    j = store.jobs.submit(SPEC)
    e = MoveEntry(str(j), 100.0, False, "cpu:1x1:pp1", "cpu:1x2:pp1", 2.0, 2.1, 3.9, 8.0, 40.0)
    store.moves.record([e])
    (row,) = store.moves.rows(j)
    assert row["ended_at"] is None and row["est_rate_after"] == 3.9 and row["forced"] is False
    assert "has not paid for itself yet" in move_line(row) and "expected 1.86x" in move_line(row)
    e.paid_back_s = 30.0                                    # later rounds: paid back, then moved again
    e.ended_s, e.end, e.iterations_after = 200.0, "moved again", 260.0
    e2 = MoveEntry(str(j), 200.0, False, "cpu:1x2:pp1", "cpu:1x1:pp1", 2.6, 3.9, 2.1, 8.0, 300.0)
    store.moves.record([e, e2])
    first, second = store.moves.rows(j)
    assert (first["end_reason"], first["iterations_after"], first["paid_back_s"]) == ("moved again", 260.0, 30.0)
    assert "made 1.30x the rate before until moved again; paid for itself after 30 s" in move_line(first)
    assert store.check() == []
    # a second open move of the same job is an inconsistency the check names
    store.moves.record([MoveEntry(str(j), 300.0, True, "a", "b", 0.0, None, None, None, 310.0)])
    assert any("2 moves open at once" in p for p in store.check())
    assert [m["at"] for m in store.moves.rows(open_only=True)] == [200.0, 300.0] and store.moves.rows(j, open_only=True)
    e2.ended_s, e2.end = 300.0, "moved again"
    store.moves.record([e2, MoveEntry(str(j), 300.0, True, "a", "b", 0.0, None, None, None, 310.0, 320.0,
                                      "service restarted")])
    assert store.check() == [] and store.moves.rows(open_only=True) == []
    assert "no estimate" in move_line(store.moves.rows(j)[-1]) and "forced" in move_line(store.moves.rows(j)[-1])


def test_a_backup_taken_while_the_service_writes_is_one_committed_state(tmp_path, capsys):
    """``arena backup`` from another connection while a writer commits job after job
    (each submitted, launched, run and finished, several transactions): every copy
    passes ``check()``, holds a prefix of the writer's jobs, and opens as a service's
    store; an existing file is refused, never overwritten."""
    import threading

    from engine.cli.main import main as cli_main
    db = tmp_path / "state.db"
    Store(db).close()
    done = threading.Event()
    written: list[int] = []

    def writer():
        with Store(db) as w:
            while not done.is_set() and len(written) < 400:
                j = w.jobs.submit(SPEC)
                g = w.launches.record_intent(j, {"dp": 1}, ["n0:0"])
                w.launches.mark(j, g, "started")
                w.jobs.set_status(j, "running", "test")
                w.launches.mark(j, g, "finished")
                w.jobs.set_status(j, "finished", "test")
                written.append(j)
    t = threading.Thread(target=writer)
    t.start()
    try:
        copies = []
        while len(written) < 20:
            time.sleep(0.01)
        for i in range(5):
            out = tmp_path / f"copy{i}.db"
            assert cli_main(["backup", "--db", str(db), "--out", str(out), "--json"]) == 0
            copies.append((out, json.loads(capsys.readouterr().out)))
    finally:
        done.set()
        t.join()
    for out, report in copies:
        with Store(out, readonly=True) as c:
            ids = [r.id for r in c.jobs.rows()]
            assert c.check() == [] and ids == list(range(1, len(ids) + 1))
            assert all(r.status == "finished" for r in c.jobs.rows()[:-1])     # at most the last one mid-way
            assert report["jobs"] == {k: v for k, v in c.jobs.status_counts().items() if v}
        assert not list(tmp_path.glob(".*.partial"))
    with Store(copies[-1][0]) as reopened:                              # a service can start on it
        assert reopened.check() == [] and len(reopened.jobs.rows()) >= 20
    before = copies[0][0].read_bytes()
    assert cli_main(["backup", "--db", str(db), "--out", str(copies[0][0])]) == 2
    assert "already exists" in capsys.readouterr().err and copies[0][0].read_bytes() == before
    assert cli_main(["backup", "--db", str(tmp_path / "none.db"), "--out", str(tmp_path / "x.db")]) == 2
    assert "no state database here" in capsys.readouterr().err and not (tmp_path / "x.db").exists()


def test_the_service_keeps_its_last_rounds(tmp_path):
    """``--keep-rounds`` reaches the store: a service deciding every round (``arena``, not
    event-driven) over four rounds with keep_rounds=2 holds rounds 3 and 4; and
    ``--keep-measurements`` reaches the executor that records them."""
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from estimators import make_performance_model
    from instances.cluster import ClusterSpec, NodeGroup
    with pytest.raises(InputError) as e:
        ServiceConfig(db_path="x", work_dir="y", keep_rounds=-1)
    assert e.value.field == "keep_rounds"
    with pytest.raises(InputError) as e:
        ServiceConfig(db_path="x", work_dir="y", keep_measurements=-1)
    assert e.value.field == "keep_measurements"
    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("arena"),
                  make_performance_model("analytic"), ReconfigCostModel(),
                  ServiceConfig(db_path=str(tmp_path / "s.db"), work_dir=str(tmp_path / "w"), keep_rounds=2,
                                keep_measurements=7),
                  log=lambda m: None)
    try:
        assert svc.executor.keep_measurements == 7
        svc.recover()
        for _ in range(4):
            svc.step(time.time())
        assert [r.idx for r in svc.store.rounds.rows()] == [3, 4]
    finally:
        svc.shutdown()


def test_a_round_records_the_policys_decision_stats(tmp_path):
    """The service's round row takes status, objective, gap and the solve time from the
    decision's ``DecisionStats``; a policy that reports none records its decision time."""
    from engine.core.context import Decisions, DecisionStats
    from engine.core.policy import Policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from instances.cluster import ClusterSpec, NodeGroup

    class Reporting(Policy):
        name = "reporting"

        def __init__(self):
            self.stats = [DecisionStats(status="optimal", objective=3.5, gap=0.01, solve_wall_s=0.25),
                          DecisionStats()]

        def decide(self, ctx):
            return Decisions({}, stats=self.stats.pop(0))

    svc = Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), Reporting(), None, ReconfigCostModel(),
                  ServiceConfig(db_path=str(tmp_path / "s.db"), work_dir=str(tmp_path / "w")), log=lambda m: None)
    try:
        svc.recover()
        svc.step(time.time())
        rec = svc.step(time.time() + 1)
        first, second = svc.store.rounds.rows()
        assert (first.policy, first.objective, first.gap, first.solve_time_s) == ("reporting", 3.5, 0.01, 0.25)
        assert first.decisions["status"] == "optimal"
        assert (second.objective, second.gap, second.decisions["status"]) == (None, None, "")
        assert second.solve_time_s == rec.decision_time_s
    finally:
        svc.shutdown()
