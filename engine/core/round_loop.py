"""The round loop, once, for both clocks.

A ``RoundLoop`` holds the engine's state (jobs and GPU ownership), a policy, the
placement and an ``Executor`` (engine/core/executor.py). Its drivers decide *when* a round
happens: the simulator (engine/sim/simulator.py) calls it at ``t0 + k x interval`` of a
virtual clock with ``SimExecutor``; the live service (engine/service/) calls it on the
wall clock (a timer, arrivals, completions, failures) with the launcher's
``MpiExecutor``. Everything between is here and nowhere else:

1. ``collect(now)``: the executor runs (simulated) or is polled (live) up to ``now``;
   jobs that finished leave at their exact completion time, jobs whose run failed go
   back to the queue from their last checkpoint (or fail for good after
   ``max_failures``); the previous round's interval is accounted (samples, GPU-seconds
   held, GPU-seconds lost to reconfiguration);
2. ``submit(job_id, now)``: arrivals join the queue;
3. ``round(now, index)``: the policy reads a ``RoundContext`` of every active job and
   returns ``Decisions``, checked before anything is carried out (a malformed decision,
   or a policy that raises, is a ``PolicyError`` naming it: engine/core/decision_check.py);
   decisions on shapes the executor knows the job cannot run on are dropped and shown to
   the policy next time (``JobView.known_infeasible_shapes``);
   the round's placement (engine/core/round_placement.py) maps grids to GPUs; the
   executor stops, moves and launches; invariants are asserted; the round is recorded.
   A shadow policy (``shadow``), when given, is asked on the same context and compared
   (``RoundRecord.shadow``, engine/core/shadow.py); its decisions are never carried out.

A policy with ``event_driven = True`` is asked only after an event (arrival,
completion, failure) or when its last decisions were not all carried out.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from estimators.base import PerformanceModel
from instances.allocation import Allocation
from instances.cluster import ClusterSpec
from instances.grid import Grid
from instances.jobs import Job

from .context import ChangeHistory, Decisions, JobView, RoundContext
from .decision_check import decide
from .executor import Executor, JobProgress
from .invariants import check_invariants
from .move_ledger import MoveEntry, MoveLedger
from .online_feed import OnlineFeed
from .placement import Placer
from .policy import Policy
from .reconfig import ReconfigCostModel
from .round_placement import place_requests, take_fallbacks
from .shadow import Shadow, ShadowComparison
from .state import EngineState, JobStatus

# the shortest time a round is accounted over (a wall clock may repeat or step back)
MIN_ACCOUNTED_S = 1e-6


@dataclass
class RoundRecord:
    index: int
    time_s: float
    submitted: int = 0               # jobs submitted this round
    queued: int = 0                  # after the decision
    running: int = 0
    finished_total: int = 0
    changes_total: int = 0           # moves and preemptions so far, every job (the change budget's spend)
    launches: int = 0
    reconfigurations: int = 0        # moves of running jobs and resumes of preempted ones
    preemptions: int = 0
    evictions: int = 0               # running jobs moved or stopped because their node left service
    gpus_out: int = 0                # GPUs on nodes out of service (drained or down) at this round
    infeasible_drops: int = 0
    packing_failures: int = 0        # chosen grids placement could not map to GPUs, as decided
    displaced: int = 0               # left waiting because a truth-rejected move kept its GPUs
    repairs: int = 0                 # packing failures the placer's own repair step fixed
    refines: int = 0                 # times the policy decided again without the columns placement could not map
    fallbacks: int = 0               # chosen grids that did not fit, replaced by the policy's smaller fallback
    fallback_waits: int = 0          # chosen jobs left waiting: neither their grid nor a fallback fitted
    failures: int = 0                # runs that failed since the previous round (live)
    decision_time_s: float = 0.0     # the policy's decision, its refinements and fallbacks included
    context_time_s: float = 0.0      # building the policy's RoundContext
    decided: bool = False            # the policy was called this round
    # over the interval [time_s, next round), filled at the next round:
    throughput_samples_per_s: float = 0.0
    gpu_busy_s: dict = field(default_factory=dict)       # per GPU type, GPU-seconds held
    reconfig_lost_gpu_s: float = 0.0
    shadow: ShadowComparison | None = None   # a shadow policy's decision compared (engine/core/shadow.py)


class RoundLoop:
    def __init__(self, cluster: ClusterSpec, policy: Policy, executor: Executor, *,
                 perf: PerformanceModel | None = None, reconfig: ReconfigCostModel | None = None,
                 round_interval_s: float,
                 jobs: Iterable[Job] = (), seed: int = 0, check_invariants: bool = True,
                 max_failures: int = 3, failure_backoff_s: float = 30.0,
                 on_decided: Callable[[RoundContext, Decisions, RoundRecord], None] | None = None,
                 shadow: Policy | None = None):
        self.cluster, self.policy, self.executor = cluster, policy, executor
        self.perf, self.reconfig = perf, reconfig
        self.round_interval_s, self.seed = round_interval_s, seed
        self.check = check_invariants
        self.max_failures, self.failure_backoff_s = max_failures, failure_backoff_s
        self.on_decided = on_decided          # called with each decision before it is carried out
        self.state = EngineState(cluster, list(jobs))
        self.placer = Placer(cluster)
        # asked beside the policy, never carried out; its fallbacks taken as the policy's are
        self.shadow = None if shadow is None else Shadow(shadow, settle=self._settle)
        self.rounds: list[RoundRecord] = []
        self.event_driven = policy.event_driven
        # queued jobs given to the policy (and the shadow): at most the larger of their
        # ``max_queued`` windows (0: every queued job, also when either has none)
        windows = [p.max_queued for p in (policy, shadow) if p is not None]
        self.queue_window = 0 if 0 in windows else max(windows)
        self._need_decide = True
        self._ended = False               # jobs finished or failed since the last round
        self._failed_since = 0
        self._checked_version = -1
        self._prev_iters: dict[str, float] = {}
        self._prev_now: float | None = None
        self._gpu_types = list(self.state.cluster.gpus_by_type)
        self._busy_by_type = {t: 0 for t in self._gpu_types}    # GPUs held, per type, since the last round
        self._samples_prev = 0.0
        self._lost_prev = 0.0
        self._feed = OnlineFeed(perf)     # measured iteration times -> a perf model that learns online
        self.moves = MoveLedger()         # every move: what the decision expected, what it gave

    # ------------------------------------------------------------------------------
    def add_job(self, job: Job) -> None:
        """A job that becomes known while the loop runs (live submissions)."""
        self.state.add_job(job)

    def submit(self, job_id: str, now: float) -> None:
        self.state.submit(job_id, now)
        self._need_decide = True

    def cancel(self, job_id: str, now: float) -> None:
        """End a job for good at the user's request; a running one is stopped first (its
        checkpoint is kept)."""
        st = self.state
        if st.jobs[job_id].status is JobStatus.RUNNING:
            self.hold(job_id, now, why="cancelled")
        else:                             # (a queued job's move entry can be open after a restart)
            self.moves.closed(job_id, now, st.jobs[job_id].iterations_done, "cancelled")
        st.cancel(job_id, now)
        self._need_decide = True

    def hold(self, job_id: str, now: float, *, why: str = "held") -> None:
        """Set a queued or running job aside at a user's request (``EngineState.hold``); a
        running one is stopped with a checkpoint and keeps what it holds."""
        st = self.state
        if st.jobs[job_id].status is JobStatus.RUNNING:
            self.executor.stop(job_id, now)
            st.hold(job_id, now, kept_iterations=self.executor.progress(job_id).iterations_done)
            self.moves.closed(job_id, now, st.jobs[job_id].iterations_done, why)
            self._prev_iters.pop(job_id, None)
        else:
            st.hold(job_id, now)
            self.moves.closed(job_id, now, st.jobs[job_id].iterations_done, why)
        self._need_decide = True

    def set_priority(self, job_id: str, priority: float) -> None:
        """A user changed the job's priority; the next round decides with it."""
        self.state.set_priority(job_id, priority)
        self._need_decide = True

    def release(self, job_id: str, now: float) -> None:
        """A held job goes back to the queue; it resumes from where it was held."""
        self.state.release(job_id, now)
        self._need_decide = True

    def adopt_running(self, job: Job, alloc: Allocation, iterations_done: float, now: float) -> None:
        """A job whose launch an earlier process started and the executor has taken over
        (``AdoptingExecutor.adopt``, a restarted service): recorded as running on ``alloc``
        at ``iterations_done`` from ``now``, without a launch. Its start counts as a first
        start (the engine's history of it began with this process)."""
        st = self.state
        if job.job_id not in st.jobs:
            st.add_job(job)
        st.submit(job.job_id, now)
        if iterations_done:
            st.set_progress(job.job_id, iterations_done)
        st.start(job.job_id, alloc, now)
        self._need_decide = True

    def set_unavailable(self, nodes: Iterable[int], now: float) -> list[str]:
        """Take nodes out of service (drained for maintenance, or down) from now on, and
        back in: ``nodes`` is the whole set unavailable from now. The next round moves every
        running job holding a GPU there elsewhere (the policy decides where, as for any
        job; a move, device to device where the executor can) or, when there is no room,
        stops it with its checkpoint (an eviction either way). Returns those jobs' ids."""
        st = self.state
        nodes = st.cluster.check_nodes(nodes)
        st.cluster.set_unavailable(nodes)
        self._need_decide = True
        return self._leaving(nodes)

    def _leaving(self, nodes: frozenset[int]) -> list[str]:
        """Running jobs holding a GPU on one of ``nodes``."""
        return [jid for jid, r in self.state.running.items() if r.alloc is not None and r.alloc.on_any(nodes)]

    def collect(self, now: float) -> list[JobProgress]:
        """Bring the executor to ``now``; book completions and failures; account the
        previous round over the time since it (``now`` - its ``time_s``, at least 1 µs).
        Returns what finished or failed."""
        st, ex = self.state, self.executor
        st.set_time(now)
        ended = ex.advance(now)
        freed_after: dict[str, float] = {t: 0.0 for t in self._gpu_types}
        for p in ended:
            r = st.jobs[p.job_id]
            if r.status is not JobStatus.RUNNING or r.alloc is None:
                continue                  # a late report of a run the engine already stopped
            gt, g = r.alloc.grid.gpu_type, r.alloc.grid.num_gpus
            at = p.finished_at_s if p.finished_at_s is not None else now
            freed_after[gt] += (now - at) * g
            if p.failed:
                self.moves.closed(p.job_id, at, p.last_checkpoint_iteration, "failed")
                st.fail_run(p.job_id, at, p.last_checkpoint_iteration, p.failed, self.max_failures,
                            self.failure_backoff_s, infeasible_shape=not ex.runs_on(r.job, r.alloc.grid.shape),
                            final=p.final)
                self._prev_iters.pop(p.job_id, None)     # it resumes from its last checkpoint
                self._failed_since += 1
            else:
                st.set_progress(p.job_id, p.iterations_done)
                self.moves.closed(p.job_id, at, p.iterations_done, "finished")
                st.finish(p.job_id, at)
        totals = ex.totals()
        if self.rounds:
            rec = self.rounds[-1]
            interval_s = max(now - rec.time_s, MIN_ACCOUNTED_S)
            rec.throughput_samples_per_s = (totals.samples_done - self._samples_prev) / interval_s
            rec.gpu_busy_s = {t: self._busy_by_type[t] * interval_s - freed_after[t] for t in self._gpu_types}
            rec.reconfig_lost_gpu_s = totals.reconfig_lost_gpu_s - self._lost_prev
            self._lost_prev = totals.reconfig_lost_gpu_s
        self._samples_prev = totals.samples_done
        self._ended = bool(ended)
        if ended:
            self._need_decide = True
        return ended

    def round(self, now: float, index: int, submitted: int = 0) -> RoundRecord:
        """Decide (when due), place and carry out one round at ``now``."""
        st, ex = self.state, self.executor
        rec = RoundRecord(index, now, submitted=submitted, failures=self._failed_since,
                          gpus_out=sum(st.cluster.nodes[n].num_gpus for n in st.cluster.unavailable))
        self._failed_since = 0
        if self._prev_now is not None and any(self._prev_now < r.retry_after_s <= now for r in st.queued.values()):
            self._need_decide = True          # a failed job's backoff ended: it is offered again
        if self._need_decide or not self.event_driven:
            for jid in st.running:
                p = ex.progress(jid)
                st.set_progress(jid, p.iterations_done)
                self.moves.observe(jid, now, p.iterations_done)
                st.jobs[jid].measured_iteration_time_s = p.measured_iteration_time_s
                st.jobs[jid].wall_iteration_time_s = p.wall_iteration_time_s
                self._feed.report(st.jobs[jid].job, st.jobs[jid].alloc, p)
            self._feed.keep_only(st.running)
            t_ctx = time.perf_counter()
            ctx = self.context(now, index)
            t_dec = time.perf_counter()
            rec.context_time_s = t_dec - t_ctx
            decisions = decide(self.policy, ctx)        # checked: a bad one is a PolicyError naming it
            decisions = self._settle(decisions)
            rec.decision_time_s = time.perf_counter() - t_dec      # (refinements and fallbacks included)
            rec.refines = decisions.stats.placement_refines
            rec.fallbacks = decisions.stats.placement_repairs
            rec.fallback_waits = len(decisions.stats.placement_dropped)
            rec.decided = True
            if self.shadow is not None and ctx.jobs:      # (with no job, nothing to compare)
                rec.shadow = self.shadow.observe(ctx, decisions)
            if self.on_decided is not None:
                self.on_decided(ctx, decisions, rec)
            self._apply(decisions, now, rec)
            self._busy_by_type = st.cluster.used_by_type()
            # an event-driven policy is asked again only after an event, or when this
            # round's decisions were not all carried out
            self._need_decide = bool(rec.infeasible_drops or rec.packing_failures or rec.displaced)
        elif self._ended:
            self._busy_by_type = st.cluster.used_by_type()
        rec.queued, rec.running, rec.finished_total = len(st.queued), len(st.running), len(st.finished_ids)
        rec.changes_total = st.changes_count
        if self.check:
            gpus_changed = st.cluster.version != self._checked_version
            check_invariants(st, now, self._prev_now, self._prev_iters if gpus_changed else None, gpus=gpus_changed)
            if gpus_changed:
                self._checked_version = st.cluster.version
                self._prev_iters = {j: r.iterations_done for j, r in st.running.items()}
        self._prev_now = now
        self.rounds.append(rec)
        return rec

    # ------------------------------------------------------------------------------
    def context(self, now: float, index: int) -> RoundContext:
        st = self.state
        views = []
        for r in st.running.values():
            change = None
            if r.changed_at_s is not None:
                change = ChangeHistory(r.changed_at_s, r.iterations_done - r.iterations_at_change,
                                       r.rate_before_change, tuple(r.change_times_s), r.changes_total)
            views.append(JobView(r.job, r.job.num_iterations - r.iterations_done, r.alloc,
                                 st.attained_gpu_s_at(r, now), r.queued_s, r.reconfigurations,
                                 r.measured_iteration_time_s, r.known_infeasible, change))
        queued = [r for r in st.queued.values() if r.retry_after_s <= now]   # (others back off after a failure)
        left_out = 0
        if self.queue_window and len(queued) > self.queue_window:      # the policy's window (``max_queued``)
            left_out = len(queued) - self.queue_window
            queued = heapq.nsmallest(self.queue_window, queued,
                                     key=lambda r: (-r.job.priority, r.job.arrival_s, r.job.job_id))
        for r in queued:
            views.append(JobView(r.job, r.job.num_iterations - r.iterations_done, None,
                                 r.attained_gpu_s, st.queued_s_at(r, now), r.reconfigurations,
                                 None, r.known_infeasible))
        views.sort(key=lambda v: (v.job.arrival_s, v.job.job_id))
        return RoundContext(now, index, self.round_interval_s, self.cluster, tuple(views), self.perf,
                            self.reconfig, self.seed, len(st.finished_ids), st.changes_count,
                            st.cluster.unavailable, left_out)

    def _settle(self, decisions: Decisions) -> Decisions:
        """The round's placement, step 1 (engine/core/round_placement.py): a policy's
        fallbacks taken where its grids do not fit."""
        return take_fallbacks(self.placer, decisions, self.state.running_allocations(), self.state.cluster.unavailable)

    def _apply(self, decisions: Decisions, now: float, rec: RoundRecord) -> None:
        st, ex = self.state, self.executor
        requests: dict[str, Grid] = {}
        dropped: dict[str, Grid] = {}     # running jobs whose decided move was rejected at truth
        for jid, grid in decisions.grids.items():
            r = st.jobs.get(jid)
            if r is None or r.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
                raise ValueError(f"policy decided for job {jid!r}, which is "
                                 f"{'unknown' if r is None else r.status.value}")
            if not isinstance(grid, Grid):
                raise TypeError(f"policy decision for job {jid!r} is {grid!r}, not a Grid")
            if (r.alloc is None or r.alloc.grid.shape != grid.shape) and not ex.runs_on(r.job, grid.shape):
                rec.infeasible_drops += 1
                r.infeasible_drops += 1
                r.known_infeasible = r.known_infeasible | {grid.shape}
                if r.alloc is not None:
                    requests[jid] = r.alloc.grid      # keep running where it is
                    dropped[jid] = grid
                continue
            requests[jid] = grid
        current = st.running_allocations()
        leaving = set(self._leaving(st.cluster.unavailable)) if st.cluster.unavailable else set()   # must leave
        placed = place_requests(self.placer, requests, dropped, decisions.placements, current,
                                st.cluster.unavailable, leaving)
        rec.packing_failures = len(placed.packing_failures)
        rec.displaced = placed.displaced
        rec.repairs = placed.repaired
        for jid in placed.packing_failures:
            st.jobs[jid].packing_failures += 1
        allocs = placed.allocations
        # stops: running jobs with no allocation this round (evicted: they had to leave)
        for jid in [j for j in st.running if j not in allocs]:
            ex.stop(jid, now)
            st.stop(jid, now, kept_iterations=ex.progress(jid).iterations_done, evicted=jid in leaving)
            self.moves.closed(jid, now, st.jobs[jid].iterations_done, "evicted" if jid in leaving else "preempted")
            self._prev_iters.pop(jid, None)
            if jid in leaving:
                rec.evictions += 1
            else:
                rec.preemptions += 1
        # moves: release first, then assign
        moving = [(jid, a) for jid, a in allocs.items() if jid in current and a is not current[jid]
                  and (a.gpus != current[jid].gpus or a.grid != current[jid].grid)]
        for jid, a in moving:          # every mover leaves its GPUs before any takes new ones
            st.release_for_move(jid)
            ex.release(jid, now, target=a)
        for jid, a in moving:
            st.move(jid, a, now, forced=jid in leaving)
            self._ledger_move(jid, current[jid], a, now, forced=jid in leaving)
            ex.reconfigure(jid, a, decisions.plans.get(jid), now)
            self._kept_by_move(jid)
            rec.reconfigurations += 1
            rec.evictions += jid in leaving
        # launches
        for jid, a in allocs.items():
            r = st.jobs[jid]
            if r.status is JobStatus.QUEUED:
                resumed = r.first_start_s is not None
                st.start(jid, a, now)
                self.moves.launched(jid, now, str(a.grid), r.iterations_done)
                ex.launch(r.job, a, decisions.plans.get(jid), now)
                rec.launches += 1
                if resumed:
                    rec.reconfigurations += 1

    def _kept_by_move(self, job_id: str) -> None:
        """What the job keeps after its move: a move through storage whose ranks were killed
        before they could save at the stop (a host cut off, a stop past its timeout, a
        device-to-device transfer that failed) resumes from the last checkpoint, below the
        progress read before the move; those steps are lost (``lost_iterations``), as at a
        stop, and the job's progress is the checkpoint's, so that the new launch's readings
        never go back. (The move's ledger entry and change history keep the progress at the
        move: the lost steps count against it.)"""
        r = self.state.jobs[job_id]
        kept = self.executor.progress(job_id).iterations_done
        if kept < r.iterations_done - 1e-9:
            self.state.resumed_from_checkpoint(job_id, kept)
            self._prev_iters.pop(job_id, None)     # it resumes from its last checkpoint

    def _ledger_move(self, job_id: str, old, new, now: float, *, forced: bool) -> None:
        """Open the move's ledger entry: the rate measured before it, the performance
        model's estimates of both grids and the move's price."""
        r = self.state.jobs[job_id]

        def rate(grid: Grid) -> float | None:
            if self.perf is None:
                return None
            est = self.perf.estimate(r.job, grid)
            t = est.iteration_time_s
            return 1.0 / t if est.feasible and 0 < t < float("inf") else None
        price = self.reconfig.cost_s(r.job, old, new) if self.reconfig is not None else None
        self.moves.opened(MoveEntry(job_id, now, forced, str(old.grid), str(new.grid), r.rate_before_change,
                                    rate(old.grid), rate(new.grid), price, r.iterations_done))
