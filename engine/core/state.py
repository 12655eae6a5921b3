"""Cluster and job state of the engine (simulated or live).

``ClusterState`` records which GPU ``(node_id, index)`` holds which job; ``JobRecord``
the lifecycle of one job (pending arrival -> queued -> running <-> queued -> finished;
live, a job can also be held: set aside by a user, off the queue, until released).
Both change only through the methods here, which the simulator calls; policies never
see them (they read an immutable ``RoundContext``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Iterable

from instances.allocation import Allocation, GpuId
from instances.cluster import ClusterSpec, Node
from instances.jobs import Job


class StateError(RuntimeError):
    """An engine operation that would corrupt the state (a bug, never bad input)."""


class JobStatus(enum.Enum):
    PENDING = "pending"        # not yet submitted (arrives later)
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"          # its runs kept failing (live only); the reason is recorded
    HELD = "held"              # set aside by a user (live only): keeps its progress, not offered to the policy


class ClusterState:
    """GPU ownership. ``owner[node_id][i]`` is the job id on GPU i of that node, or None."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.nodes: tuple[Node, ...] = spec.nodes()
        self.owner: list[list[str | None]] = [[None] * n.num_gpus for n in self.nodes]
        self.free_count: list[int] = [n.num_gpus for n in self.nodes]
        self.holdings: dict[str, tuple[GpuId, ...]] = {}
        by_type: dict[str, list[int]] = {}
        for n in self.nodes:                # appended, then frozen: linear in the nodes
            by_type.setdefault(n.gpu_type, []).append(n.node_id)
        self.nodes_by_type: dict[str, tuple[int, ...]] = {t: tuple(ids) for t, ids in by_type.items()}
        self.gpus_by_type: dict[str, int] = spec.gpus_by_type()
        self.version = 0            # bumped by every assign/release
        self._used: tuple[int, dict[str, int]] = (-1, {})     # used_by_type at a version
        self.unavailable: frozenset[int] = frozenset()     # nodes drained or down: nothing is placed there

    def check_nodes(self, nodes: Iterable[int]) -> frozenset[int]:
        """``nodes`` as a set of this cluster's node ids, or a ``StateError`` naming one it lacks."""
        nodes = frozenset(nodes)
        bad = sorted((n for n in nodes if not (isinstance(n, int) and 0 <= n < len(self.nodes))), key=repr)
        if bad:
            raise StateError(f"no node {bad[0]!r} in cluster {self.spec.name!r} (nodes 0-{len(self.nodes) - 1})")
        return nodes

    def set_unavailable(self, nodes: Iterable[int]) -> None:
        """Nodes to keep empty from now on: no GPU there is assigned again, and the jobs
        holding one must leave at the next round (``RoundLoop``; an invariant checks it)."""
        nodes = self.check_nodes(nodes)
        if nodes != self.unavailable:
            self.unavailable = nodes
            self.version += 1

    def assign(self, job_id: str, gpus: tuple[GpuId, ...]) -> None:
        if job_id in self.holdings:
            raise StateError(f"job {job_id} already holds GPUs {self.holdings[job_id]}")
        for n, i in gpus:
            if not (0 <= n < len(self.nodes) and 0 <= i < self.nodes[n].num_gpus):
                raise StateError(f"job {job_id}: GPU {(n, i)} does not exist")
            if self.owner[n][i] is not None:
                raise StateError(f"job {job_id}: GPU {(n, i)} already held by {self.owner[n][i]}")
            if n in self.unavailable:
                raise StateError(f"job {job_id}: GPU {(n, i)} is on node {n}, which is unavailable")
        self.version += 1
        for n, i in gpus:
            self.owner[n][i] = job_id
            self.free_count[n] -= 1
        self.holdings[job_id] = tuple(gpus)

    def release(self, job_id: str) -> tuple[GpuId, ...]:
        gpus = self.holdings.pop(job_id, None)
        if gpus is None:
            raise StateError(f"job {job_id} holds no GPUs")
        self.version += 1
        for n, i in gpus:
            self.owner[n][i] = None
            self.free_count[n] += 1
        return gpus

    def used_by_type(self) -> dict[str, int]:
        """GPUs held per type (a fresh dict; counted again only after an assign/release)."""
        if self._used[0] != self.version:
            out = {t: 0 for t in self.gpus_by_type}
            for t, ids in self.nodes_by_type.items():
                out[t] = sum(self.nodes[n].num_gpus - self.free_count[n] for n in ids)
            self._used = (self.version, out)
        return dict(self._used[1])


@dataclass
class JobRecord:
    """One job's lifecycle; mutable, owned by the engine."""
    job: Job
    status: JobStatus = JobStatus.PENDING
    alloc: Allocation | None = None
    iterations_done: float = 0.0
    submitted_s: float | None = None
    first_start_s: float | None = None
    finish_s: float | None = None
    launches: int = 0               # starts from the queue (first start and resumes)
    reconfigurations: int = 0       # allocation changes of a job that had already run
    preemptions: int = 0
    evictions: int = 0                  # moved or stopped because its node went out of service
    attained_gpu_s: float = 0.0     # GPU-seconds held
    queued_s: float = 0.0           # time spent queued since submission
    infeasible_drops: int = 0       # policy decisions dropped because the oracle said infeasible
    packing_failures: int = 0
    known_infeasible: frozenset = field(default_factory=frozenset)   # shapes seen infeasible
    measured_iteration_time_s: float | None = None   # reported by the executor while running
    wall_iteration_time_s: float | None = None       # ... on the wall clock (JobProgress), where it reports it
    failures: int = 0               # runs that failed (live): it resumes from its last checkpoint
    failure_reason: str | None = None
    retry_after_s: float = float("-inf")   # after a failed run: not offered to the policy before
    lost_iterations: float = 0.0    # progress lost to failures and stops past the last checkpoint
    # the last change of allocation (start, resume or move), for the stability rule:
    changed_at_s: float | None = None
    iterations_at_change: float = 0.0
    rate_before_change: float = 0.0     # iterations/s measured before it (0: it was queued)
    change_times_s: list = field(default_factory=list)   # moves and preemptions (not first starts), newest last
    changes_total: int = 0              # moves and preemptions over its whole life
    _since_s: float = 0.0           # when the current status (queued/running) began

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def ever_placed(self) -> bool:
        return self.first_start_s is not None


class EngineState:
    """All jobs' records plus the cluster; every transition validated."""

    def __init__(self, spec: ClusterSpec, jobs: list[Job] | tuple[Job, ...]):
        self.cluster = ClusterState(spec)
        self.jobs: dict[str, JobRecord] = {}
        for j in jobs:
            if j.job_id in self.jobs:
                raise StateError(f"duplicate job id {j.job_id!r}")
            self.jobs[j.job_id] = JobRecord(j)
        self.queued: dict[str, JobRecord] = {}    # insertion order = submission order
        self.running: dict[str, JobRecord] = {}
        self.held: dict[str, JobRecord] = {}
        self.finished_ids: list[str] = []
        self.failed_ids: list[str] = []           # failed for good or cancelled (live only)
        self.submitted_count = 0
        self.changes_count = 0                    # moves and preemptions of every job, finished ones included
        self.now_s: float = float("-inf")

    # -- clock ---------------------------------------------------------------------
    def set_time(self, t: float) -> None:
        if t < self.now_s:
            raise StateError(f"clock moved backwards: {t} < {self.now_s}")
        self.now_s = t

    # -- transitions ---------------------------------------------------------------
    def submit(self, job_id: str, t: float) -> None:
        r = self.jobs[job_id]
        if r.status is not JobStatus.PENDING:
            raise StateError(f"job {job_id} submitted twice")
        r.status, r.submitted_s, r._since_s = JobStatus.QUEUED, t, t
        self.queued[job_id] = r
        self.submitted_count += 1

    def start(self, job_id: str, alloc: Allocation, t: float) -> None:
        r = self.jobs[job_id]
        if r.status is not JobStatus.QUEUED:
            raise StateError(f"job {job_id} started while {r.status.value}")
        self.cluster.assign(job_id, alloc.gpus)
        r.queued_s += t - r._since_s
        r.status, r.alloc, r._since_s = JobStatus.RUNNING, alloc, t
        if r.first_start_s is None:
            r.first_start_s = t
        else:
            r.reconfigurations += 1     # a resume after preemption changes its GPUs
        r.launches += 1
        self._changed(r, t, 0.0, counted=False)
        del self.queued[job_id]
        self.running[job_id] = r

    def move(self, job_id: str, alloc: Allocation, t: float, *, forced: bool = False) -> None:
        """Reconfigure a running job; the caller has released its old GPUs first.
        ``forced``: it had to leave a node that went out of service (not a change the
        stability rule or the change budget counts)."""
        r = self.jobs[job_id]
        if r.status is not JobStatus.RUNNING:
            raise StateError(f"job {job_id} reconfigured while {r.status.value}")
        self.cluster.assign(job_id, alloc.gpus)
        r.attained_gpu_s += (t - r._since_s) * r.alloc.grid.num_gpus
        # the rate before, on the clock the progress after the move is read on (iterations over wall time:
        # the move ledger's payback and the stability rule compare the two)
        it = r.wall_iteration_time_s or r.measured_iteration_time_s
        self._changed(r, t, 1.0 / it if it else 0.0, counted=not forced)
        r.alloc, r._since_s = alloc, t
        r.reconfigurations += 1
        if forced:
            r.evictions += 1

    #: how many move/preemption times a record keeps (the stability rule looks back one hour)
    CHANGE_HISTORY = 32

    def _changed(self, r: JobRecord, t: float, rate_before: float, counted: bool) -> None:
        r.changed_at_s, r.iterations_at_change, r.rate_before_change = t, r.iterations_done, rate_before
        if counted:
            self._count_change(r, t)

    def _count_change(self, r: JobRecord, t: float) -> None:
        """A move or preemption: the job's history and the cluster's count."""
        r.change_times_s.append(t)
        del r.change_times_s[:-self.CHANGE_HISTORY]
        r.changes_total += 1
        self.changes_count += 1

    def release_for_move(self, job_id: str) -> None:
        self.cluster.release(job_id)

    def resumed_from_checkpoint(self, job_id: str, kept_iterations: float) -> None:
        """A running job's move went through storage without a checkpoint at its stop (its
        ranks were killed: a host cut off, a stop past its timeout, a failed transfer): it
        resumes from ``kept_iterations`` (its last checkpoint), and the steps after it are
        lost, as at a stop (``lost_iterations``)."""
        r = self.jobs[job_id]
        if r.status is not JobStatus.RUNNING:
            raise StateError(f"job {job_id} resumed from a checkpoint while {r.status.value}")
        self._keep(r, kept_iterations)


    def _leave_running(self, job_id: str, t: float, what: str) -> JobRecord:
        """Release a running job's GPUs and book the GPU-seconds it held."""
        r = self.jobs[job_id]
        if r.status is not JobStatus.RUNNING:
            raise StateError(f"job {job_id} {what} while {r.status.value}")
        self.cluster.release(job_id)
        r.attained_gpu_s += (t - r._since_s) * r.alloc.grid.num_gpus
        del self.running[job_id]
        return r

    def stop(self, job_id: str, t: float, kept_iterations: float | None = None, *, evicted: bool = False) -> None:
        """Preempt a running job; it keeps ``kept_iterations`` (what its checkpoint holds;
        default: all of its progress). ``evicted``: stopped because its node went out of
        service, not by a decision, so it is not a change the stability rule or the change
        budget counts (as a failed run is not); its resume is still a reconfiguration."""
        r = self._leave_running(job_id, t, "stopped")
        self._keep(r, kept_iterations)
        r.status, r.alloc, r._since_s = JobStatus.QUEUED, None, t
        r.measured_iteration_time_s = r.wall_iteration_time_s = None
        if evicted:
            r.evictions += 1
        else:
            r.preemptions += 1
            self._count_change(r, t)
        self.queued[job_id] = r

    def fail_run(self, job_id: str, t: float, kept_iterations: float, reason: str, max_failures: int,
                 backoff_s: float = 30.0, *, infeasible_shape: bool = False, final: bool = False) -> None:
        """A running job's run failed: back to the queue from its last checkpoint, offered
        to the policy again after an exponential backoff; after ``max_failures`` failed
        runs it fails for good with ``reason``. ``infeasible_shape``: the run could not
        start on its shape (e.g. the plan does not fit in memory): the shape is recorded
        as infeasible for the job, which is offered again at once and not counted as a
        failure (the policy will not choose that shape again). ``final``: the failure would
        recur on any retry (a non-finite loss): the job fails for good at once."""
        r = self._leave_running(job_id, t, "failed")
        assert r.alloc is not None
        shape = r.alloc.grid.shape
        self._keep(r, kept_iterations)
        r.alloc, r._since_s, r.measured_iteration_time_s, r.wall_iteration_time_s = None, t, None, None
        r.failure_reason = reason
        if infeasible_shape:
            r.known_infeasible = r.known_infeasible | {shape}
            r.infeasible_drops += 1
            r.status = JobStatus.QUEUED
            self.queued[job_id] = r
            return
        r.failures += 1
        if final or r.failures >= max_failures:
            r.status, r.finish_s = JobStatus.FAILED, t
            self.failed_ids.append(job_id)
            return
        r.status = JobStatus.QUEUED
        r.retry_after_s = t + backoff_s * 2 ** (r.failures - 1)
        self.queued[job_id] = r

    @staticmethod
    def _keep(r: JobRecord, kept_iterations: float | None) -> None:
        """The job's progress is now what its checkpoint holds (it may be ahead of the
        last progress the engine read, or behind it: the steps after it are lost)."""
        if kept_iterations is None:
            return
        kept = min(float(r.job.num_iterations), max(0.0, float(kept_iterations)))
        r.lost_iterations += max(0.0, r.iterations_done - kept)
        r.iterations_done = kept

    def cancel(self, job_id: str, t: float, reason: str = "cancelled") -> None:
        """End a queued or held job for good (a running one is stopped first)."""
        r = self.jobs[job_id]
        if r.status is JobStatus.QUEUED:
            r.queued_s += t - r._since_s
            del self.queued[job_id]
        elif r.status is JobStatus.HELD:
            del self.held[job_id]
        else:
            raise StateError(f"job {job_id} cancelled while {r.status.value}")
        r.status, r.finish_s, r.failure_reason = JobStatus.FAILED, t, reason
        self.failed_ids.append(job_id)

    def hold(self, job_id: str, t: float, kept_iterations: float | None = None) -> None:
        """Set a job aside at a user's request: a running one leaves its GPUs keeping
        ``kept_iterations`` (what its checkpoint holds); it is not offered to the policy
        until ``release``. Not a preemption: the stability rule and the change budget do
        not count it (the user decided it, not the scheduler)."""
        r = self.jobs[job_id]
        if r.status is JobStatus.RUNNING:
            self._leave_running(job_id, t, "held")
            self._keep(r, kept_iterations)
            r.alloc, r.measured_iteration_time_s, r.wall_iteration_time_s = None, None, None
        elif r.status is JobStatus.QUEUED:
            r.queued_s += t - r._since_s
            del self.queued[job_id]
        else:
            raise StateError(f"job {job_id} held while {r.status.value}")
        r.status, r._since_s = JobStatus.HELD, t
        self.held[job_id] = r

    def release(self, job_id: str, t: float) -> None:
        """A held job goes back to the queue (behind the jobs queued before it)."""
        r = self.jobs[job_id]
        if r.status is not JobStatus.HELD:
            raise StateError(f"job {job_id} released while {r.status.value}")
        del self.held[job_id]
        r.status, r._since_s = JobStatus.QUEUED, t
        self.queued[job_id] = r

    def set_priority(self, job_id: str, priority: float) -> None:
        """A user changed the job's priority (live): the job is the same but for it."""
        r = self.jobs[job_id]
        if r.status not in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.HELD):
            raise StateError(f"job {job_id}: priority changed while {r.status.value}")
        r.job = replace(r.job, priority=float(priority))

    def add_job(self, job: Job) -> JobRecord:
        """A job that becomes known while the engine runs (live submissions)."""
        if job.job_id in self.jobs:
            raise StateError(f"duplicate job id {job.job_id!r}")
        r = self.jobs[job.job_id] = JobRecord(job)
        return r

    def finish(self, job_id: str, t: float) -> None:
        r = self._leave_running(job_id, t, "finished")
        r.status, r.finish_s, r._since_s = JobStatus.FINISHED, t, t
        self.finished_ids.append(job_id)

    def set_progress(self, job_id: str, iterations_done: float) -> None:
        r = self.jobs[job_id]
        if iterations_done < r.iterations_done - 1e-9:
            raise StateError(f"job {job_id}: iterations decreased {r.iterations_done} -> {iterations_done}")
        r.iterations_done = min(float(r.job.num_iterations), iterations_done)

    # -- views ---------------------------------------------------------------------
    def running_allocations(self) -> dict[str, Allocation]:
        """Every running job's allocation."""
        out = {}
        for jid, r in self.running.items():
            if r.alloc is None:
                raise StateError(f"job {jid} is running without an allocation")
            out[jid] = r.alloc
        return out

    def attained_gpu_s_at(self, r: JobRecord, t: float) -> float:
        if r.status is JobStatus.RUNNING:
            return r.attained_gpu_s + (t - r._since_s) * r.alloc.grid.num_gpus
        return r.attained_gpu_s

    def queued_s_at(self, r: JobRecord, t: float) -> float:
        if r.status is JobStatus.QUEUED:
            return r.queued_s + (t - r._since_s)
        return r.queued_s

    def active(self) -> list[JobRecord]:
        return list(self.running.values()) + list(self.queued.values())
