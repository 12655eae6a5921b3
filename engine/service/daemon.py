"""The live rescheduling service: the round loop (engine/core/round_loop.py) on the wall clock,
with the launcher's ``MpiExecutor`` journaled in the SQLite state store.

A round happens on a timer (``round_interval_s``), when a job is submitted, cancelled,
held or released, and when a run finishes or fails (never closer together than
``min_round_gap_s``). Each round: the executor is polled (completions, failed runs);
cancel and hold requests, releases and new submissions are taken from the store; the
policy decides; the decision is recorded in the store (``rounds``) *before* it is
carried out; then the journaled executor stops,
moves and launches (see journal.py).

Crash safety. Everything the service knows is in the store, committed before its effect
starts. On start (``recover``) every launch the store still calls active (``intent`` or
``started``) belongs to a service that died: its ranks, if they still run, are asked to
checkpoint and exit (then killed after ``stop_timeout_s``); a job whose training had
finished meanwhile is marked finished, any other goes back to the queue and resumes
from its last checkpoint. A queued job whose last run folder still has ranks training
(the service died in the middle of a device-to-device move, after the old launch ended
in the store) has them stopped the same way. Queued jobs are read back with their
progress (the step of that checkpoint). So a ``kill -9`` at any moment loses no job,
gives no GPU to two jobs (the store refuses it, the loop's invariants assert it) and
loses no step past a job's last checkpoint. ``SIGTERM`` (``shutdown``) stops every running job with a checkpoint.
Recovery first sets aside what the work folder holds and the database does not know (a
database restored from an older copy): workdir.py. The move ledger's open moves follow
their jobs across the restart (``_resume_moves``). One service per database and work
folder: the service holds lock.py's lock for its life.

A run that fails goes back to the queue from its last checkpoint and is offered to the
policy again after a backoff (``failure_backoff_s`` x 2^(failures-1)); after
``max_failures`` failed runs the job fails for good with the reason. A run that stopped
at a non-finite loss, and a launch refused for the job's data file, fail the job for good
at once (``JobProgress.final``: a retry from the same checkpoint and data would fail the
same way), and do not count toward draining the node.

Data files (and model ``config.json`` files) are read only from the data roots
(``ServiceConfig.data_roots``, ``arena serve --data-root``; default the work folder):
checked at submission, and at every launch and by the ranks on the file they open
(launcher/datafile.py), so a file swapped after submission fails the job rather than
training on something else.

A held job (``arena hold``; a running one is stopped with a checkpoint first) is outside
the loop's queue and holds no GPU until ``arena release`` queues it again; a restart does
not adopt it, so it stays held. A job submitted ``after`` others waits in the store's
queue, outside the loop (at rounds and at recovery), until they have all finished; it
fails when one of them fails or is cancelled.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from engine.core.context import Decisions, RoundContext
from engine.core.move_ledger import MoveEntry
from engine.core.policy import Policy
from engine.core.reconfig import ReconfigCostModel
from engine.core.round_loop import RoundLoop, RoundRecord
from engine.core.state import JobStatus
from instances.allocation import Allocation
from instances.cluster import ClusterSpec
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.plan import Plan
from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
from launcher.slurm_executor import SlurmExecutor
from launcher.telemetry import read_progress

from .config import ServiceConfig
from .host_watch import HostWatch
from .jobspec import JobSpec
from .journal import JournaledExecutor
from .lock import ServiceLock
from .node_health import NodeHealth
from .slurm_nodes import SlurmNodeState, SlurmSetup, read_node_record, write_node_record
from .store import TERMINAL, Store
from .why import explain
from .workdir import set_aside_unknown

SLURM_RETRY_S = 5.0                     # while the Slurm controller does not answer, asked again this often
SHUTDOWN = "service shutdown"           # why a clean shutdown stops a job (its launch's end reason begins so)

# Named points where a test may kill the service (``ARENA_FAULT=point[:n]``: SIGKILL at the
# n-th time the point is reached; test use only).
FAULT_POINTS = ("after-round-recorded", "after-launch-intent", "mid-move")


def fault_from_env(log: Callable[[str], None]) -> Callable[[str], None]:
    """The test hook named by ``ARENA_FAULT`` (``point`` or ``point:n``): SIGKILL this
    process the n-th time that point is reached."""
    spec = os.environ.get("ARENA_FAULT", "")
    if not spec:
        return lambda point: None
    point, _, n = spec.partition(":")
    if point not in FAULT_POINTS:
        raise InputError(f"unknown fault point {point!r}; known: {', '.join(FAULT_POINTS)}", field="ARENA_FAULT")
    left = [int(n or 1)]

    def hit(p: str) -> None:
        if p == point:
            left[0] -= 1
            if left[0] == 0:
                log(f"ARENA_FAULT: killing the service at {p}")
                os.kill(os.getpid(), signal.SIGKILL)
    return hit


def _stderr(msg: str) -> None:
    print(f"[arena serve {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Service:
    def __init__(self, cluster: ClusterSpec, policy: Policy, perf: object, reconfig: ReconfigCostModel,
                 cfg: ServiceConfig, *, log: Callable[[str], None] = _stderr,
                 fault: Callable[[str], None] | None = None, shadow: Policy | None = None,
                 lock: ServiceLock | None = None, slurm: SlurmSetup | None = None):
        """``lock``: this state's lock (lock.py), already taken (``arena serve`` takes it
        before it checks the port); else the service takes it before it opens the store.
        ``slurm``: the cluster read from Slurm (``arena serve --slurm``; ``cluster`` is its
        spec): launches are Slurm batch jobs and Slurm's node state is read every round
        (slurm_nodes.py)."""
        self.cluster, self.cfg, self.log = cluster, cfg, log
        self.policy_name = policy.name
        self.shadow_name = None if shadow is None else shadow.name
        self.fault = fault or (lambda point: None)
        self.lock = lock if lock is not None else ServiceLock.acquire(cfg.db_path, cfg.work_dir)   # (makes work_dir)
        try:
            self.store = Store(cfg.db_path)
        except BaseException:
            self.lock.release()
            raise
        try:
            self.store.refuse_damaged(field="--db")      # before the API or recovery reads a row
        except BaseException:
            self.store.close()
            self.lock.release()
            raise
        mpi_cfg = MpiExecutorConfig(
            work_dir=cfg.work_dir, checkpoint_every=cfg.checkpoint_every,
            checkpoint_interval_s=cfg.checkpoint_interval_s, stop_timeout_s=cfg.stop_timeout_s,
            poll_interval_s=min(cfg.poll_interval_s, 0.2), epoch_s=time.time(), step_delay_s=cfg.step_delay_s,
            move_path=cfg.move_path, data_roots=cfg.data_roots, run_stall_s=cfg.launch_stall_after_s or None,
            node_hosts={} if slurm is not None else
            {n.node_id: n.host for n in cluster.nodes() if n.host is not None})
        try:
            self.mpi: MpiExecutor = MpiExecutor(mpi_cfg) if slurm is None else SlurmExecutor(mpi_cfg, slurm.executor)
            # Slurm's node state, read again before every round (None: not on Slurm)
            self.slurm_nodes = None
            if slurm is not None:
                _, restarted_at = read_node_record(cfg.work_dir)
                self.slurm_nodes = SlurmNodeState(slurm, log, last_restart_at=restarted_at)
                write_node_record(cfg.work_dir, tuple(n.host or "" for n in cluster.nodes()), restarted_at)
        except BaseException:
            self.store.close()
            self.lock.release()
            raise
        # off Slurm, with hosts: whether each host answers (host_watch.py; None: no hosts, or not watched)
        self.host_watch = HostWatch(dict(mpi_cfg.node_hosts), port=cfg.host_check_port,
                                    interval_s=cfg.host_check_interval_s, down_after_s=cfg.host_down_after_s,
                                    log=log) if mpi_cfg.node_hosts and cfg.host_check_interval_s else None
        self._host_version = 0
        self.executor = JournaledExecutor(self.mpi, self.store, self.fault, beat=self._renew,
                                          keep_measurements=self.cfg.keep_measurements,
                                          before_move=self.store_moves, log=log)
        self.loop = RoundLoop(cluster, policy, self.executor, perf=perf, reconfig=reconfig,
                              round_interval_s=cfg.round_interval_s, max_failures=cfg.max_failures,
                              failure_backoff_s=cfg.failure_backoff_s, on_decided=self._record_round,
                              shadow=shadow)
        self.health = NodeHealth(cfg.drain_after_failures, cfg.failure_window_s)
        self.wake = threading.Event()          # set by the API on a submission, cancel, hold or release
        self._trigger = "start"
        self._last_round = -math.inf
        self._round_index = 0
        self.started_at = time.time()
        self._beat = time.monotonic()          # the scheduler's last sign of life (liveness())
        self._phase = "starting"
        self._moves_written = 0                # ledger entries stored so far ...
        self._moves_open: list = []            # ... and those of them still open (rewritten as they change)
        # the last round's parts, in seconds (bench/bench_service_round.py): ``adopt_s`` the
        # executor polled, the store's requests read and carried out, submissions adopted;
        # ``decide_s`` the policy's context built and its decision; ``record_s`` the decision
        # committed; ``carry_s`` the rest (placement, stops, moves and launches with their
        # journal, invariants, the move ledger stored)
        self.round_parts: dict[str, float] = {}
        self._record_s = 0.0
        # the idle loop's checks (due) read the store only after another connection (the
        # API, a command) committed to it, or after a round: its data version when a look
        # found nothing to act on (None: look)
        self._quiet_version: int | None = None
        self._next_retry = math.inf            # the earliest backoff end after the last round
        self._taken_over: set[tuple[str, int]] = set()   # (job, launch folder) re-adopted at recovery
        self._slurm_retry_at = -math.inf       # on Slurm: the controller is asked again from then
        # on Slurm: the new nodes this service left its loop for, to restart in place (``run``;
        # arena serve executes itself again when it is set)
        self.restart_in_place: tuple[str, ...] = ()

    # ------------------------------------------------------------------------------
    def _alive(self, phase: str) -> None:
        self._beat, self._phase = time.monotonic(), phase

    def _renew(self) -> None:
        """A sign of life inside a phase: each job's launch, stop or move (a round or a
        shutdown that stops many jobs, each within stop_timeout_s, is not a stall)."""
        self._beat = time.monotonic()

    def liveness(self) -> dict:
        """What the scheduler thread is doing and for how long (read by the API's health
        check, from another thread): ``phase`` (starting, recovering, idle, round N,
        stopping, stopped), ``since_s`` (seconds since it entered that phase or, when idle,
        since its last poll) and ``stalled`` (longer than ``stall_after_s``, but for
        stopped)."""
        since = time.monotonic() - self._beat
        return {"phase": self._phase, "since_s": since,
                "stalled": self._phase != "stopped" and since > self.cfg.stall_after_s}

    def node_failures(self) -> dict[int, int]:
        """Per node, the different jobs whose runs failed on it within ``failure_window_s``
        (node_health.py; read by the API's ``/metrics``, from another thread)."""
        return self.health.counts(time.time())

    def recover(self) -> None:
        """Take over from a service that stopped (cleanly or not); see the module doc."""
        self._alive("recovering")
        st = self.store
        # what the work folder holds and the database does not know (restored from an older copy)
        ex = self.mpi
        set_aside_unknown(self.cfg.work_dir, st.launches.last_generations(), self.cfg.stop_timeout_s, self.log,
                          alive=lambda: self._alive("recovering"), running=ex.left_running, stop=ex.stop_left)
        open_moves = self._open_moves()       # (read before the launches below are ended)
        for row in st.jobs.rows():                 # ranks left training by a move the crash interrupted
            launches = st.launches.rows(row.id)
            if row.status in TERMINAL or not launches or launches[-1].state == "started":
                continue                      # (a started launch is taken over or stopped below)
            ran = [lch for lch in launches if (lch.pid_info or {}).get("run_dir")]
            self._alive("recovering")             # each job's stop takes up to stop_timeout_s
            if ran and ex.left_running(ran[-1].pid_info["run_dir"]):
                clean = ex.stop_left(ran[-1].pid_info["run_dir"], None, self.cfg.stop_timeout_s)
                self.log(f"job {row.id}: ranks of launch {ran[-1].generation} were still training (a move "
                         f"the restart interrupted); {'asked to checkpoint and stopped' if clean else 'killed'}")
        for launch in st.launches.active():
            self._alive("recovering")
            jid, gen = launch.job_id, launch.generation
            if self._take_over(launch):
                continue
            info = launch.pid_info or {}
            run_dir = info.get("run_dir") or str(Path(self.cfg.work_dir) / str(jid) / f"launch_{gen}")
            ranks = "its ranks had already exited"
            if Path(run_dir).is_dir():
                training = ex.left_running(run_dir)      # (asked first: the log says what was there)
                clean = ex.stop_left(run_dir, info.get("pid"), self.cfg.stop_timeout_s)
                if training:
                    how = "asked to checkpoint and stopped" if clean else "killed after the grace period"
                    ranks = f"its ranks were {how}"
            prog = read_progress(Path(self.cfg.work_dir) / str(jid) / "progress.json") or {}
            if prog.get("status") == "finished":
                st.launches.mark(jid, gen, "finished" if launch.state == "started" else "failed",
                               reason="training had finished while the service was down")
                self._set_status(jid, "finished", "training finished while the service was down")
                self.log(f"job {jid}: launch {gen} was active at restart; {ranks}: training had finished while "
                         f"the service was down (step {prog.get('iterations_done')})")
                continue
            self.log(f"job {jid}: launch {gen} was active at restart; {ranks}")
            ck = int(prog.get("last_checkpoint_step") or 0)
            st.launches.mark(jid, gen, "failed", reason=f"service restarted; resumes from step {ck}")
            self._set_status(jid, "queued", f"service restarted; resumes from step {ck}")
        if isinstance(ex, SlurmExecutor):     # launches of this service's tag the database has no active launch for
            for found, clean in ex.stop_unknown(self._taken_over, self.cfg.stop_timeout_s):
                self.log(f"Slurm job {found.slurm_job_id} (job {found.job_id}, launch folder {found.launch_index}) "
                         f"is not an active launch in the state database; "
                         f"{'asked to checkpoint and stopped' if clean else 'cancelled after the grace period'}")
        self.end_orphans()
        rows = [r for r in st.jobs.rows()
                if r.status in ("queued", "running") and str(r.id) not in self.loop.state.jobs]
        deps = self._dep_statuses(rows)
        for row in rows:
            prog = read_progress(Path(self.cfg.work_dir) / str(row.id) / "progress.json") or {}
            if prog.get("status") == "finished":
                self._set_status(row.id, "finished", self._finished_unseen(row.id, prog))
            elif row.status == "running" or self._ready(row, deps):   # (one waiting for others is left out)
                self._adopt(row.id, row.spec, row.submitted_at)
        self._resume_moves(open_moves)
        for node in sorted(set(st.nodes.drained()) - set(range(len(self.cluster.nodes())))):
            self.log(f"node {node} is drained in the database but cluster {self.cluster.name!r} has no such node; "
                     f"ignored (`arena undrain {node}` clears it)")
        if self.health.threshold:             # the failed runs counted toward a drain before the restart
            failures = st.nodes.failures(since=time.time() - self.cfg.failure_window_s)
            for node, jid, at in failures:
                if node < len(self.loop.state.cluster.nodes):
                    self._drain_flagged(self.health.record([node], str(jid), at))
            if failures:
                self.log(f"{len(failures)} failed run(s) within the last {self.cfg.failure_window_s:g} s count on "
                         f"toward their nodes' drain: {self.health.counts(time.time())}")
        last = st.rounds.rows(last=1)
        self._round_index = last[0].idx if last else 0
        problems = st.check()
        if problems:
            raise RuntimeError("state database inconsistent after recovery: " + "; ".join(problems[:5]))

    def _finished_unseen(self, jid: int, prog: dict) -> str:
        """Why a job the store has queued is finished: its last launch completed as it was
        being stopped, or (no launch in the store: a database restored from an older copy,
        whose later launches' folders were set aside) its work folder says so."""
        if self.store.launches.rows(jid):
            return "training finished as its last launch was stopped"
        return (f"training finished (step {prog.get('iterations_done')}, its work folder's progress.json) in launches "
                "this database does not know: a database restored from an older copy")

    def _take_over(self, launch) -> bool:
        """Re-adoption: the store's active launch ``launch`` (state ``started``, or ``intent``
        whose start went through before the crash) taken over by the executor where it can
        (``adopt``: Slurm finds the job by its tag; nothing is relaunched or stopped). Still
        running: the job runs on in the round loop. Ended while the service was down: the
        launch is accounted from Slurm and the run folder, finished (the job is) or failed
        (the job resumes from its checkpoint). False when the executor does not adopt or
        knows no such launch: the caller stops what is left and queues the job."""
        ex = self.mpi
        if not hasattr(ex, "adopt"):
            return False
        st, jid, gen = self.store, launch.job_id, launch.generation
        row = st.jobs.get(jid)
        info = launch.pid_info or {}
        run_dir = Path(info.get("run_dir") or Path(self.cfg.work_dir) / str(jid) / f"launch_{gen}")
        index = run_dir.name.removeprefix("launch_")
        if row.status in TERMINAL or not index.isdigit():
            return False
        try:
            spec = JobSpec.from_dict(row.spec, source=f"job {jid} in the state database", check_files=False)
            job = spec.to_job(str(jid), row.submitted_at)
            alloc, plan = self._launch_allocation(launch)
        except (InputError, ValueError, KeyError, TypeError) as e:
            self.log(f"job {jid}: launch {gen} cannot be taken over ({e}); it is stopped and relaunched")
            return False
        ex.set_job_options(job.job_id, seed=spec.seed, data_path=spec.data)
        p = self.executor.adopt(job, alloc, plan, int(index), gen)
        if p is None:
            return False
        self._taken_over.add((str(jid), int(index)))
        where = f"Slurm job {info['slurm_job_id']}" if info.get("slurm_job_id") else f"run folder {run_dir.name}"
        if p.running:
            if launch.state == "intent":
                st.launches.mark(jid, gen, "started", pid_info=self.executor._pid_info(job.job_id))
            self._set_status(jid, "running", f"taken over after a restart ({where}, at step {int(p.iterations_done)})")
            self.loop.adopt_running(job, alloc, p.iterations_done, max(time.time(), self.loop.state.now_s))
            self.log(f"job {jid}: launch {gen} ({where}) still runs: taken over at step {int(p.iterations_done)}, "
                     f"nothing relaunched")
        elif p.finished:
            st.launches.mark(jid, gen, "finished", reason=f"training finished while the service was down ({where})")
            self._set_status(jid, "finished", "training finished while the service was down")
            self.log(f"job {jid}: launch {gen} ({where}) finished while the service was down")
        else:
            ck = int(p.last_checkpoint_iteration)
            st.launches.mark(jid, gen, "failed", reason=f"ended while the service was down: {str(p.failed)[:1500]}")
            self._set_status(jid, "queued", f"its run ended while the service was down; resumes from step {ck}: "
                                            f"{str(p.failed)[:300]}")
            self.log(f"job {jid}: launch {gen} ({where}) ended while the service was down: {str(p.failed)[:200]}; "
                     f"resumes from step {ck}")
            if not p.final:
                self.count_node_failure(str(jid), alloc.nodes, time.time())
        return True

    @staticmethod
    def _launch_allocation(launch) -> tuple[Allocation, Plan | None]:
        """The allocation and plan a launch record names (``journal.plan_record``)."""
        rec = launch.plan
        grid = Grid(Shape(rec["gpu_type"], int(rec["nodes"]), int(rec["gpus_per_node"])), pp=int(rec["pp"]))
        gpus = tuple(sorted((int(n), int(i)) for n, i in (g.split(":") for g in launch.gpus)))
        plan = None
        if "stage_layers" in rec:
            plan = Plan(pp=int(rec["pp"]), dp=int(rec["dp"]), tp=int(rec["tp"]),
                        stage_layers=tuple(int(x) for x in rec["stage_layers"]),
                        microbatches=int(rec.get("microbatches") or 1))
        return Allocation(grid, gpus), plan

    def _open_moves(self) -> dict[tuple[int, float], float | None]:
        """The move-ledger entries the last service left open, (job, time) -> ``None`` for
        those whose job was running where its move put it when that service stopped (the
        job's latest launch is on the move's grid, begun at or after the move, and was still
        active — the service died — or stopped by the service's shutdown), else when the
        job's latest launch ended (or ``nan``: it was active). Read before recovery ends
        the active launches."""
        out: dict[tuple[int, float], float | None] = {}
        for m in self.store.moves.rows(open_only=True):
            launches = self.store.launches.rows(m["job_id"])
            last = launches[-1] if launches else None
            active = last is not None and last.state in ("intent", "started")
            there = last is not None and last.plan.get("grid") == m["to_grid"] and last.created_at >= m["at"]
            if there and (active or last.reason.startswith(SHUTDOWN)):
                out[(m["job_id"], m["at"])] = None
            else:
                out[(m["job_id"], m["at"])] = math.nan if last is None or active else last.updated_at
        return out

    def _resume_moves(self, open_moves: dict[tuple[int, float], float | None]) -> None:
        """The ledger follows a job across a restart: an open entry of a job that ran where
        its move put it and is queued again stays open in this run's ledger
        (``MoveLedger.reopen``; it closes at the job's next change, or when the job
        relaunches on another grid), so the steps it makes after the restart count too. Any
        other open entry closes now at what the job's progress says (its last step if it
        finished meanwhile, else the checkpoint it resumes from)."""
        led, now = self.loop.moves, time.time()
        carried, ended = [], []
        for m in self.store.moves.rows(open_only=True):
            e = MoveEntry(str(m["job_id"]), m["at"], m["forced"], m["from_grid"], m["to_grid"], m["rate_before"],
                          m["est_rate_before"], m["est_rate_after"], m["price_s"], m["iterations_at"],
                          iterations_after=m["iterations_after"], paid_back_s=m["paid_back_s"])
            led.reopen(e)
            self._moves_open.append(e)
            rec = self.loop.state.jobs.get(e.job_id)
            stopped_at = open_moves.get((m["job_id"], m["at"]), math.nan)
            if stopped_at is None and rec is not None and rec.status in (JobStatus.QUEUED, JobStatus.RUNNING):
                carried.append(e.job_id)
                continue
            prog = read_progress(Path(self.cfg.work_dir) / e.job_id / "progress.json") or {}
            finished = self.store.jobs.get(m["job_id"]).status == "finished"
            done = float((prog.get("iterations_done") if finished else prog.get("last_checkpoint_step")) or 0)
            at = now if finished or stopped_at is None or math.isnan(stopped_at) else max(stopped_at, e.time_s)
            led.closed(e.job_id, at, done, "finished" if finished else "service restarted")
            ended.append(e.job_id)
        if carried or ended:
            self.store_moves()
            self.log(f"move ledger: {len(carried)} open move(s) of the last run carried on"
                     + (f" (jobs {', '.join(carried)})" if carried else "")
                     + (f", {len(ended)} ended (jobs {', '.join(ended)})" if ended else ""))

    def _adopt(self, jid: int, spec_dict: dict, submitted_at: float) -> None:
        spec = JobSpec.from_dict(spec_dict, source=f"job {jid} in the state database", check_files=False)
        job = spec.to_job(str(jid), submitted_at)
        self.mpi.set_job_options(job.job_id, seed=spec.seed, data_path=spec.data)
        self.loop.add_job(job)
        prog = read_progress(Path(self.cfg.work_dir) / str(jid) / "progress.json") or {}
        done = float(prog.get("last_checkpoint_step") or 0)
        if done:
            self.loop.state.set_progress(job.job_id, done)
        self.loop.submit(job.job_id, max(submitted_at, self.loop.state.now_s))

    def check_runnable(self, spec: JobSpec) -> None:
        """Refuse a job that no grid of this cluster can run: every GPU count and shape is
        estimated not to fit in memory (by the policy's performance model, or the
        estimators' memory pruning when it has none). Called before a submission is stored."""
        from estimators.grids import candidate_grids
        job = spec.to_job("submission", 0.0)
        most = max(self.cluster.gpus_by_type().values())
        grids = candidate_grids(job, self.cluster, max_gpus=most)
        perf = self.loop.perf
        if perf is not None:
            grids = [g for g in grids if perf.estimate(job, g).feasible]
        if not grids:
            raise InputError(f"no grid of cluster {self.cluster.name!r} can run {spec.model} at global batch "
                             f"{spec.global_batch}: every GPU count and shape is estimated not to fit in memory",
                             file="request", field="model")

    def _set_status(self, jid: int, status: str, reason: str) -> None:
        if self.store.jobs.get(jid).status != status:
            self.store.jobs.set_status(jid, status, reason)

    # ------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set (or ``stop_after_s``), then ``shutdown``."""
        if self.host_watch is not None:
            self.host_watch.start()
        self.recover()
        self.log(f"scheduling {sum(self.cluster.gpus_by_type().values())} GPUs with {self.policy_name}; "
                 f"rounds every {self.cfg.round_interval_s:g} s and on events; state in {self.cfg.db_path}")
        try:
            while not stop.is_set():
                self._alive("idle")
                now = time.time()
                if self.cfg.stop_after_s is not None and now - self.started_at >= self.cfg.stop_after_s:
                    self.log(f"stop-after {self.cfg.stop_after_s:g} s reached")
                    break
                if self.due(now) and self._slurm_ready(now):
                    if self.slurm_nodes is not None and self.slurm_nodes.restart_for:
                        self.restart_in_place = self.slurm_nodes.restart_for
                        break
                    self.step(now)
                self.wake.wait(self.cfg.poll_interval_s)
                self.wake.clear()
        finally:
            self._alive("stopping")
            if self.host_watch is not None:
                self.host_watch.stop()
            if self.restart_in_place:
                self.leave_for_restart()
            else:
                self.shutdown()
            self._alive("stopped")

    def leave_for_restart(self) -> None:
        """Leave the state as a crash would, for a restart in place that takes in the nodes
        the Slurm partition gained (``restart_in_place``): no job is stopped or
        checkpointed (the restarted service re-adopts the running Slurm jobs); the move
        ledger is stored, the time of this restart recorded (slurm_nodes.py's
        ``RESTART_GAP_S``), the store closed and the lock released."""
        assert self.slurm_nodes is not None
        names = self.restart_in_place
        self.log(f"the Slurm partition gained nodes {self.slurm_nodes.describe(names)}: restarting in place to "
                 f"take them in; running jobs are re-adopted")
        try:
            self.store_moves()
        except Exception as e:                # the next start ends what is left open
            self.log(f"the move ledger was not stored before the restart: {e}")
        nodes, _ = read_node_record(self.cfg.work_dir)
        write_node_record(self.cfg.work_dir, nodes, time.time())
        self.store.close()
        self.lock.release()

    @property
    def trigger(self) -> str:
        """Why the next round happens ("" until ``due`` finds a reason; "start" before the first)."""
        return self._trigger

    def due(self, now: float) -> bool:
        """Whether a round is due at ``now`` (the scheduler asks at every poll); when it is,
        ``trigger`` says why. Reads the store only when it changed since the last look."""
        if now - self._last_round < self.cfg.min_round_gap_s:
            return False
        if self.wake.is_set() or self._trigger:
            self._trigger = self._trigger or "request"
            return True
        if self.mpi.has_events() or self.executor.has_refused():
            self._trigger = "job finished or failed"
            return True
        if self.host_watch is not None and self.host_watch.version != self._host_version:
            self._host_version = self.host_watch.version
            self._quiet_version = None         # a host went out of service or came back: look
        version = self.store.data_version()
        if version != self._quiet_version:     # the store changed since the last look: look
            if self._drained() | frozenset(self._outside_out()) != self.loop.state.cluster.unavailable:
                self._trigger = "node drained or returned"
                return True
            if self.admissions() or self.store.jobs.cancel_requests() or self.store.jobs.hold_requests():
                self._trigger = "submission, cancel, hold or release"
                return True
            self._quiet_version = version
        if self._last_round < self._next_retry <= now:
            self._trigger = "a failed job's backoff ended"
            return True
        if now - self._last_round >= self.cfg.round_interval_s:
            self._trigger = "timer"
            return True
        return False

    def step(self, now: float) -> RoundRecord:
        """One round at ``now`` (wall clock). Its steps (``end_orphans``, ``carry_out_holds``,
        ``sync_priorities``, ``apply_drains``, ``count_node_failure``, ``store_moves``,
        ``close_round``) are public so that a test can drive one alone."""
        loop, st = self.loop, self.loop.state
        t_start = time.perf_counter()
        self._alive(f"round {self._round_index + 1}")
        now = max(now, st.now_s)
        nodes_of = {jid: r.alloc.nodes for jid, r in st.running.items() if r.alloc is not None}
        ended = loop.collect(now)
        for p in ended:
            r = st.jobs[p.job_id]
            # a run refused or out of memory for its shape: the shape's fault, not the node's or the job's
            shape_ok = r.status is JobStatus.FINISHED or self.executor.runs_on(r.job, self._last_shape(p.job_id))
            if p.failed and p.job_id in nodes_of and shape_ok and not p.final:     # (final: the job's own fault)
                self.count_node_failure(p.job_id, nodes_of[p.job_id], now)
            if r.status is JobStatus.FINISHED:
                self._set_status(int(p.job_id), "finished", "training finished")
                self.log(f"job {p.job_id} finished")
            elif r.status is JobStatus.FAILED and p.final:
                self._set_status(int(p.job_id), "failed", f"failed, not retried (a retry would fail the same way): "
                                 f"{r.failure_reason}")
                self.log(f"job {p.job_id} failed for good, not retried: {r.failure_reason}")
            elif r.status is JobStatus.FAILED:
                self._set_status(int(p.job_id), "failed", f"failed {r.failures} times; last: {r.failure_reason}")
                self.log(f"job {p.job_id} failed for good: {r.failure_reason}")
            elif not shape_ok:
                self._set_status(int(p.job_id), "queued", f"shape refused, not counted as a failure (the policy will "
                                 f"not choose it again): {str(p.failed)[:300]}")
            else:
                self._set_status(int(p.job_id), "queued", f"run failed ({r.failures} of {self.cfg.max_failures}); "
                                 f"resumes from step {int(r.iterations_done)}: {str(p.failed)[:300]}")
                self.log(f"job {p.job_id} run failed ({r.failures}/{self.cfg.max_failures}): {str(p.failed)[:200]}")
        for jid in self.store.jobs.cancel_requests():
            key = str(jid)
            if key in st.jobs and st.jobs[key].status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.HELD):
                if st.jobs[key].status is JobStatus.RUNNING:
                    self.executor.stop_reasons[key] = "cancelled by the user"
                loop.cancel(key, now)
            self._set_status(jid, "cancelled", "cancelled by the user")
            self.log(f"job {jid} cancelled")
        self.carry_out_holds(now)
        self.sync_priorities()
        outside = self._queued_outside_loop()         # (read once: the two below share it)
        ended = self.end_orphans(outside)
        for row in self.admissions([r for r in outside if r.id not in ended]):
            if str(row.id) in st.jobs:                 # held, released since
                loop.release(str(row.id), now)
                self.log(f"job {row.id} ({row.name}) released")
            else:
                self._adopt(row.id, row.spec, row.submitted_at)
                self.log(f"job {row.id} ({row.name}) submitted")
        self.apply_drains(now)
        self._round_index += 1
        t_round, self._record_s = time.perf_counter(), 0.0
        try:
            rec = loop.round(now, self._round_index)
        finally:
            self.executor.stop_reasons.clear()         # a job that moved instead of stopping
        self.store_moves()
        self.close_round(now)
        rest = time.perf_counter() - t_round
        decide = rec.context_time_s + rec.decision_time_s
        self.round_parts = {"adopt_s": t_round - t_start, "decide_s": decide, "record_s": self._record_s,
                            "carry_s": max(0.0, rest - decide - self._record_s)}
        return rec

    def close_round(self, now: float) -> None:
        """The idle check's state after a round at ``now`` (the last of ``step``'s steps):
        the next round is at least ``min_round_gap_s`` later and ``round_interval_s`` at
        the latest, no trigger is pending, the store is read again at the next ``due``
        (the round wrote to it), and the earliest end of a queued job's backoff is found."""
        self._last_round, self._trigger = now, ""
        self._quiet_version = None                     # this round wrote to the store: look again
        self._next_retry = self._backoff_end_after(now)

    def _backoff_end_after(self, now: float) -> float:
        """The earliest end of a queued job's backoff after ``now`` (inf: none), for the idle
        check: the queue changes only in rounds, so it is found once per round."""
        return min((r.retry_after_s for r in self.loop.state.queued.values() if r.retry_after_s > now),
                   default=math.inf)

    def admissions(self, rows: list | None = None) -> list:
        """Jobs queued in the store that the loop does not have queued or running: new
        submissions whose ``after`` jobs have all finished (and jobs queued before a
        restart), and held jobs released since. ``rows``: ``_queued_outside_loop()``,
        when the caller has just read it."""
        jobs = self.loop.state.jobs
        rows = self._queued_outside_loop() if rows is None else rows
        deps = self._dep_statuses(r for r in rows if str(r.id) not in jobs)
        return [r for r in rows
                if (jobs[str(r.id)].status is JobStatus.HELD if str(r.id) in jobs else self._ready(r, deps))]

    def _queued_outside_loop(self) -> list:
        """Rows of the jobs queued in the store that the loop has not queued or running (new,
        waiting for others, or released): the ids are polled, only these rows read whole."""
        jobs, held = self.loop.state.jobs, self.loop.state.held
        ids = [i for i in self.store.jobs.ids("queued") if (k := str(i)) not in jobs or k in held]
        return self.store.jobs.rows("queued", ids=ids) if ids else []

    def _dep_statuses(self, rows) -> dict[int, str]:
        """The status of every job that one of ``rows`` runs after, in one query."""
        return self.store.jobs.statuses({d for r in rows for d in (r.spec.get("after") or ())})

    @staticmethod
    def _ready(row, deps: dict[int, str]) -> bool:
        """Every job it runs after (``JobSpec.after``) has finished (``deps``: their statuses)."""
        return all(deps.get(int(d)) == "finished" for d in row.spec.get("after") or ())

    def end_orphans(self, outside: list | None = None) -> set[int]:
        """A job waiting for others (``after``) fails when one of them failed or was
        cancelled: it would never start. ``outside``: ``_queued_outside_loop()``, when the
        caller has just read it. Returns the ids of the jobs failed."""
        outside = self._queued_outside_loop() if outside is None else outside
        rows = [r for r in outside if str(r.id) not in self.loop.state.jobs and r.spec.get("after")]
        failed: set[int] = set()
        deps = self._dep_statuses(rows)
        for row in rows:
            ended = {int(d): deps[int(d)] for d in row.spec["after"] if deps.get(int(d)) in ("failed", "cancelled")}
            if ended:
                d, why = min(ended.items())
                self._set_status(row.id, "failed", f"job {d}, which it was to run after, is {why}")
                self.log(f"job {row.id} failed: job {d}, which it was to run after, is {why}")
                failed.add(row.id)
        return failed

    def carry_out_holds(self, now: float) -> None:
        """Requested holds: a running job is stopped with a checkpoint (the store queues it),
        then the store holds it. A hold withdrawn in between (``release`` before it was
        carried out) leaves the job queued, in the store and in the loop."""
        st = self.loop.state
        for jid, reason in self.store.jobs.hold_requests():
            key = str(jid)
            rec = st.jobs.get(key)
            if rec is not None and rec.status in (JobStatus.QUEUED, JobStatus.RUNNING):
                if rec.status is JobStatus.RUNNING:
                    self.executor.stop_reasons[key] = "held by the user"
                self.loop.hold(key, now)
            if self.store.jobs.hold(jid):
                self.log(f"job {jid} held" + (f": {reason}" if reason else ""))
            elif rec is not None and rec.status is JobStatus.HELD:
                self.loop.release(key, now)

    def sync_priorities(self) -> None:
        """Priorities users set since the loop took the jobs (``arena priority``)."""
        jobs = self.loop.state.jobs
        for jid, prio in self.store.jobs.priorities_set().items():
            r = jobs.get(str(jid))
            if r is not None and r.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.HELD) \
                    and r.job.priority != prio:
                self.loop.set_priority(str(jid), prio)
                self.log(f"job {jid}: priority {prio:g}")

    def store_moves(self) -> None:
        """Write the move ledger's new entries, and the open ones again (they may have paid
        back or ended since), to the store."""
        entries = self.loop.moves.entries
        changed = self._moves_open + entries[self._moves_written:]
        self.store.moves.record(changed)
        self._moves_written = len(entries)
        self._moves_open = [e for e in changed if e.ended_s is None]

    def count_node_failure(self, job_id: str, nodes, now: float) -> None:
        """A run that failed on ``nodes`` (not for its shape): stored (a restart counts on
        from it), and counted toward the node's drain (``_drain_flagged``)."""
        if self.health.threshold:
            self.store.nodes.record_failure(nodes, int(job_id), now, forget_before=now - self.cfg.failure_window_s)
        self._drain_flagged(self.health.record(nodes, job_id, now))

    def _clear_node(self, node: int) -> None:
        """The node's failed runs count afresh (in memory and in the store)."""
        self.health.cleared(node)
        self.store.nodes.clear_failures(node)

    def _drain_flagged(self, flagged: list[int]) -> None:
        """Drain each node where runs of ``drain_after_failures`` different jobs failed
        within ``failure_window_s``, unless it is the last node in service (node_health.py)."""
        for node in flagged:
            jobs, drained = self.health.jobs(node), self._drained()
            if node in drained:
                continue
            if len(self.loop.state.cluster.nodes) - len(drained) <= 1:
                self._clear_node(node)                 # its count starts again
                self.log(f"node {node}: runs of jobs {', '.join(jobs)} failed on it; not drained: it is the last "
                         "node in service")
                continue
            reason = (f"auto: runs of {len(jobs)} jobs failed on it within {self.cfg.failure_window_s:g} s "
                      f"(jobs {', '.join(jobs)})")
            self.store.nodes.drain(node, reason)
            self.log(f"node {node} drained, {reason}; `arena undrain {node}` returns it")

    def _drained(self) -> frozenset[int]:
        """The nodes drained in the store that this cluster has (others are logged at recovery)."""
        return frozenset(n for n in self.store.nodes.drained() if n < len(self.loop.state.cluster.nodes))

    def _outside_out(self) -> dict[int, str]:
        """Nodes out of service by the last reading of Slurm's state, or of the hosts off Slurm
        (host_watch.py), with why (none without either)."""
        if self.slurm_nodes is not None:
            return {n: f"drained in Slurm: {why}" for n, why in self.slurm_nodes.last.out_of_service.items()}
        return {} if self.host_watch is None else self.host_watch.out_of_service()

    def apply_drains(self, now: float) -> None:
        """Nodes drained or returned since the last round (``arena drain``, the automatic
        drain, and on Slurm the nodes Slurm's last reading puts out of service): this round
        moves the jobs on such a node elsewhere (device to device where the launcher can),
        or stops them with a checkpoint when there is no room."""
        drained, outside, st = self._drained(), self._outside_out(), self.loop.state
        if self.host_watch is not None:         # (a device-to-device move needs both ends to answer)
            self.mpi.set_unreachable(self.host_watch.unreachable())
        want = drained | frozenset(outside)
        before = st.cluster.unavailable
        if want == before:
            return
        why = {n: outside[n] if n in outside and n not in drained else "drained" for n in want}
        host = {n.node_id: f" ({n.host})" if n.host else "" for n in self.cluster.nodes()}
        self.log(f"nodes out of service: {sorted(want) or 'none'} (out: "
                 + (", ".join(f"{n}{host[n]} {why[n]}" for n in sorted(want - before)) or "none")
                 + f"; returned: {', '.join(f'{n}{host[n]}' for n in sorted(before - want)) or 'none'})")
        for node in before - want:
            self._clear_node(node)                     # back in service: its failures count afresh
        for jid in self.loop.set_unavailable(want, now):
            node = min(set(st.jobs[jid].alloc.nodes) & want)
            self.executor.stop_reasons[jid] = f"node {node} {why[node]}"      # if this round stops it
            self.log(f"job {jid} must leave node {node}{host[node]} ({why[node]}): moved this round, or stopped "
                     f"with a checkpoint")

    def _slurm_ready(self, now: float) -> bool:
        """On Slurm: read Slurm's node state for the round due now; False (the round waits,
        tried again ``SLURM_RETRY_S`` later) while the controller does not answer."""
        if self.slurm_nodes is None:
            return True
        if now < self._slurm_retry_at:
            return False
        if not self.slurm_nodes.read().answered:
            self._slurm_retry_at = now + SLURM_RETRY_S
            return False
        return True

    def _last_shape(self, job_id: str) -> Shape:
        """The shape of the job's latest launch (from the store)."""
        plan = self.store.launches.rows(int(job_id))[-1].plan
        return Shape(plan["gpu_type"], plan["nodes"], plan["gpus_per_node"])

    def _record_round(self, ctx: RoundContext, decisions: Decisions, rec: RoundRecord) -> None:
        """The decision, committed before it is carried out."""
        t0 = time.perf_counter()
        stats = decisions.stats
        grids = {jid: str(g) for jid, g in decisions.grids.items()}
        plans = {jid: {"dp": p.dp, "tp": p.tp, "pp": p.pp} for jid, p in decisions.plans.items()}
        current = {v.job_id: str(v.current.grid) for v in ctx.jobs if v.current is not None}

        def finite(x: object) -> float | None:
            return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
        recorded = {"grids": grids, "plans": plans, "before": current, "status": stats.status,
                    "jobs": len(ctx.jobs)}
        why = explain(ctx, decisions, self.policy_name)        # fewer GPUs than asked, or none (why.py)
        if why:
            recorded["why"] = why
        self._preemption_reasons(ctx, decisions)
        if rec.shadow is not None:           # the shadow policy's view of the same round (engine/core/shadow.py)
            recorded["shadow"] = rec.shadow.to_dict()
            if rec.shadow.error is not None:
                self.log(f"shadow policy {rec.shadow.policy} failed this round: {rec.shadow.error}")
        self.store.rounds.record(policy=self.policy_name, trigger=self._trigger or "timer",
                                solve_time_s=float(rec.decision_time_s if stats.solve_wall_s is None
                                                   else stats.solve_wall_s),
                                objective=finite(stats.objective), gap=finite(stats.gap),
                                decisions=recorded, keep=self.cfg.keep_rounds)
        self._record_s += time.perf_counter() - t0
        self.fault("after-round-recorded")

    def _preemption_reasons(self, ctx: RoundContext, decisions: Decisions) -> None:
        """For each running job this decision leaves without a grid (not one that must
        leave a node out of service: ``apply_drains`` named those), the reason its history
        gives when it is stopped: which round's decision preempted it, and which jobs take
        the GPUs it held (those leaving a node out of service said so: a drain on a full
        cluster can cost a job on a node in service its GPUs)."""
        out = ctx.unavailable_nodes
        held = {v.job_id: set(v.current.gpus) for v in ctx.jobs if v.current is not None}
        leaving = {j for j, gpus in held.items() if any(n in out for n, _ in gpus)}
        for jid in held.keys() - decisions.grids.keys() - leaving:
            takers = sorted((j for j, gpus in decisions.placements.items() if j != jid and held[jid] & set(gpus)),
                            key=int)
            why = [f"job {j}" + (" (leaving a node out of service)" if j in leaving else "") for j in takers]
            reason = (f"preempted by round {ctx.round_index}'s decision ({self.policy_name} gave it no grid this "
                      "round" + (f"; its GPUs go to {', '.join(why)}" if why else "") + ")")
            self.executor.stop_reasons.setdefault(jid, reason)
            self.log(f"job {jid} {reason}")

    def shutdown(self) -> None:
        """Stop every running job with a checkpoint (they resume on the next start)."""
        now = max(time.time(), self.loop.state.now_s)
        for jid in list(self.loop.state.running):
            try:
                self.executor.stop(jid, now, reason=SHUTDOWN)
                self.loop.state.stop(jid, now, kept_iterations=self.mpi.progress(jid).iterations_done)
                # its move stays open: the next start carries it on (_resume_moves)
                self.loop.moves.observe(jid, now, self.loop.state.jobs[jid].iterations_done)
            except Exception as e:            # keep stopping the others; the next start recovers
                self.log(f"job {jid}: stop at shutdown failed: {e}")
        try:
            self.store_moves()
        except Exception as e:                # the next start ends what is left open
            self.log(f"the move ledger was not stored at shutdown: {e}")
        self.mpi.close()
        self.store.close()
        self.lock.release()
        self.log("stopped; running jobs were checkpointed")
