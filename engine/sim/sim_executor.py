"""Simulated executor: jobs advance at the oracle's TRUE iteration time.

The speed of a job on an allocation comes only from ``oracle.true_iteration_time(job,
shape)`` (never from an estimator). Every launch or reconfiguration starts a downtime
priced by the ``ReconfigCostModel``; during it the job holds its GPUs and makes no
progress. Downtime longer than a round carries into the next rounds. Progress is
continuous (fractional iterations): a stopped job keeps all of it, as if checkpointed
at the moment it stopped (an approximation of frequent checkpointing).

Measured iteration times are reported as a real job's would be, never the truth itself:
each iteration run on the current allocation takes the true time times an independent
log-normal factor of mean 1 and coefficient of variation ``iteration_noise_cv`` (step
time jitter; default ``DEFAULT_ITERATION_NOISE_CV``, a stated default: the measured
table has no repeats to take it from), and ``JobProgress`` carries their mean over the
whole iterations run there so far (``measured_iterations``). Factors are drawn from one
generator seeded by ``seed``, as iterations complete; beyond ``EXACT_NOISE_DRAWS`` new
iterations at once their sum is drawn from its normal approximation (central limit; the
mean of that many factors is within a fraction of a percent of 1 anyway). Progress
itself advances at the true time.

Jobs whose rate changes as they progress (adaptive-batch goodput jobs, instances/goodput.py)
are run by an oracle that has ``segment(job, shape, progress, plan)``: it returns the
rate until the end of the current stretch (an epoch: the job's statistical efficiency
and the batch it chooses change between epochs), and an event at that point asks again.
The plan a decision carried (``launch``/``reconfigure``) is handed to ``segment`` (a
``BatchPlan``: the batch the job keeps or may choose from). Jobs of an oracle without
``segment`` run at one rate per allocation, as before.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from engine.core.executor import ExecutorTotals, JobProgress
from engine.core.reconfig import ReconfigCostModel
from instances.allocation import Allocation
from instances.grid import Shape
from instances.jobs import Job
from instances.oracle import Oracle
from instances.plan import JobPlan

DEFAULT_ITERATION_NOISE_CV = 0.05      # per-iteration step-time jitter (stated default)
EXACT_NOISE_DRAWS = 256                 # above this many new iterations: normal approximation of the sum


class InfeasibleAllocation(ValueError):
    """The oracle says the job cannot run on this shape (e.g. out of memory)."""


@dataclass
class _Run:
    job: Job
    alloc: Allocation | None
    iteration_time_s: float | None
    iterations_done: float = 0.0
    t_last_s: float = 0.0           # progress is accounted up to here
    busy_until_s: float = 0.0       # downtime ends here
    downtime_is_launch: bool = True
    finished_at_s: float | None = None
    launch_down_gpu_s: float = 0.0
    reconfig_down_gpu_s: float = 0.0
    downtime_s: float = 0.0
    gen: int = 0                    # bumped on every launch/stop/reconfigure: stale events are ignored
    computing: bool = False         # counted in the cluster's sample rate
    rate: float = 0.0               # samples/s while computing
    measured_from: float = 0.0      # iterations done when the run on this allocation started
    noise_n: int = 0                # iterations measured there so far ...
    noise_sum: float = 0.0          # ... and the sum of their noise factors
    plan: JobPlan | None = None                # the decision's plan (segment oracles read it)
    seg_end: float | None = None    # segment oracles: progress where the current rate ends


_DOWN_END, _FINISH, _SEGMENT = 0, 1, 2


class SimExecutor:
    """Event-driven: a heap holds each running job's next event (end of its downtime, or
    its completion). Between events the cluster's sample rate is constant, so advancing
    over a quiet round costs O(1) and an event O(log jobs); per-job progress is brought
    up to date lazily."""

    def __init__(self, oracle: Oracle, reconfig: ReconfigCostModel, *,
                 iteration_noise_cv: float = DEFAULT_ITERATION_NOISE_CV, seed: int = 0):
        if not (isinstance(iteration_noise_cv, (int, float)) and math.isfinite(iteration_noise_cv)
                and iteration_noise_cv >= 0):
            raise ValueError(f"iteration_noise_cv must be a finite number >= 0, got {iteration_noise_cv!r}")
        self.oracle = oracle
        self.reconfig = reconfig
        self.iteration_noise_cv = float(iteration_noise_cv)
        self._noise_rng = np.random.default_rng(seed)
        self._runs: dict[str, _Run] = {}
        self._running: dict[str, _Run] = {}
        self._iter_cache: dict[tuple[str, Shape], float | None] = {}
        self.samples_done: float = 0.0        # over all jobs, for throughput
        self.reconfig_lost_gpu_s_total: float = 0.0   # GPU-seconds held in reconfiguration downtime
        self.now_s: float = float("-inf")
        self._rate = 0.0                      # samples/s of the jobs computing now
        self._down_gpus = 0                   # GPUs held in reconfiguration downtime now
        self._events: list[tuple[float, int, str, int, int]] = []   # (time, seq, job, gen, kind)
        self._seq = 0
        self._carry: list[JobProgress] = []   # completions found outside ``advance``
        self._segments = callable(getattr(oracle, "segment", None))   # rates that change with progress

    @property
    def rates_change_with_progress(self) -> bool:
        """Whether the oracle's rates change as a job progresses (it has ``segment``, as
        Sia's goodput oracle): jobs then run segment by segment; else each at one rate."""
        return self._segments

    # -- truth ---------------------------------------------------------------------
    def true_iteration_time(self, job: Job, shape: Shape) -> float | None:
        key = (job.job_id, shape)
        if key not in self._iter_cache:
            t = self.oracle.true_iteration_time(job, shape)
            if t is not None and not t > 0:
                raise ValueError(f"oracle returned a non-positive iteration time {t!r} "
                                 f"for job {job.job_id} on {shape}")
            self._iter_cache[key] = t
        return self._iter_cache[key]

    # -- Executor protocol ---------------------------------------------------------
    def runs_on(self, job: Job, shape: Shape) -> bool:
        return self.true_iteration_time(job, shape) is not None

    def totals(self) -> ExecutorTotals:
        return ExecutorTotals(self.samples_done, self.reconfig_lost_gpu_s_total)

    def launch(self, job: Job, alloc: Allocation, plan: JobPlan | None, now_s: float) -> None:
        self._run_until(now_s)
        r = self._runs.get(job.job_id)
        if r is not None and r.alloc is not None:
            raise RuntimeError(f"job {job.job_id} launched while running")
        if r is not None and r.finished_at_s is not None:
            raise RuntimeError(f"job {job.job_id} launched after it finished")
        if self._segments:
            it = self._segment_rate(job, alloc.grid.shape, r.iterations_done if r is not None else 0.0, plan)
        else:
            it = self.true_iteration_time(job, alloc.grid.shape)
        if it is None:
            raise InfeasibleAllocation(f"job {job.job_id} cannot run on {alloc.grid.shape}")
        resumed = r is not None
        if r is None:
            r = _Run(job, None, None)
            self._runs[job.job_id] = r
        r.t_last_s = now_s
        r.plan = plan
        self._running[job.job_id] = r
        self._start(r, alloc, it, self.reconfig.cost_s(job, None, alloc, resumed), True)

    def stop(self, job_id: str, now_s: float) -> None:
        self._run_until(now_s)
        r = self._running.pop(job_id)
        self._progress_to(r, now_s)
        # a finish within rounding after ``now_s`` (its event not yet due) is not a finish:
        # the engine stopped the job first, and the little left runs when it resumes
        r.finished_at_s = None
        self._detach(r)
        r.alloc, r.iteration_time_s = None, None

    def release(self, job_id: str, now_s: float, *, target: Allocation | None = None) -> None:
        """Nothing to do: a simulated move takes effect at once (``reconfigure``)."""

    def reconfigure(self, job_id: str, alloc: Allocation, plan: JobPlan | None, now_s: float) -> None:
        self._run_until(now_s)
        r = self._running[job_id]
        if self._segments:
            self._progress_to(r, now_s)
            it = self._segment_rate(r.job, alloc.grid.shape, r.iterations_done, plan)
        else:
            it = self.true_iteration_time(r.job, alloc.grid.shape)
        if it is None:
            raise InfeasibleAllocation(f"job {job_id} cannot run on {alloc.grid.shape}")
        r.plan = plan
        self._progress_to(r, now_s)
        down = self.reconfig.cost_s(r.job, r.alloc, alloc)
        self._detach(r)
        self._start(r, alloc, it, down, False)

    def progress(self, job_id: str) -> JobProgress:
        r = self._runs.get(job_id)
        if r is None:
            return JobProgress(job_id, 0.0, False)
        if r.alloc is not None:
            self._progress_to(r, self.now_s)
        measured, n = self._measured(r)
        return JobProgress(job_id, r.iterations_done, r.alloc is not None,
                           finished=r.finished_at_s is not None, finished_at_s=r.finished_at_s,
                           last_checkpoint_iteration=r.iterations_done,
                           measured_iteration_time_s=measured, measured_iterations=n,
                           launch_lost_gpu_s=r.launch_down_gpu_s, reconfig_lost_gpu_s=r.reconfig_down_gpu_s)

    def advance(self, until_s: float) -> list[JobProgress]:
        if until_s < self.now_s:
            raise RuntimeError(f"executor clock moved backwards: {until_s} < {self.now_s}")
        self._run_until(until_s)
        done, self._carry = self._carry, []
        done.sort(key=lambda p: (p.finished_at_s, p.job_id))
        return done

    # -- helpers -------------------------------------------------------------------
    def _segment_rate(self, job: Job, shape: Shape, progress: float, plan: JobPlan | None) -> float | None:
        """Seconds per unit of progress from ``progress`` (segment oracles), None: infeasible."""
        seg = self.oracle.segment(job, shape, progress, plan)
        if seg is None:
            return None
        if not seg.seconds_per_unit > 0:
            raise ValueError(f"oracle returned a non-positive time per unit {seg.seconds_per_unit!r} "
                             f"for job {job.job_id} on {shape}")
        return seg.seconds_per_unit

    def _next_event(self, r: _Run, t: float) -> None:
        """Push ``r``'s next event from ``t`` (it computes): its completion, or, under a
        segment oracle, the end of its current segment when that comes first."""
        if self._segments:
            seg = self.oracle.segment(r.job, r.alloc.grid.shape, r.iterations_done, r.plan)
            if seg is not None:
                if seg.seconds_per_unit != r.iteration_time_s:
                    self._rate -= r.rate
                    r.iteration_time_s = seg.seconds_per_unit
                    r.rate = r.job.global_batch / r.iteration_time_s
                    self._rate += r.rate
                end = seg.end_progress
                if end < r.job.num_iterations - 1.0 and end > r.iterations_done:
                    r.seg_end = end
                    self._push(t + (end - r.iterations_done) * r.iteration_time_s, r, _SEGMENT)
                    return
            r.seg_end = None
        self._push(t + (r.job.num_iterations - r.iterations_done) * r.iteration_time_s, r, _FINISH)

    def _measured(self, r: _Run) -> tuple[float | None, float]:
        """(mean measured iteration time, whole iterations it averages) of ``r``'s run on
        its allocation: the true time times the mean of per-iteration noise factors."""
        if r.iteration_time_s is None:
            return None, 0.0
        n = int(math.floor(r.iterations_done - r.measured_from + 1e-9))
        k = n - r.noise_n
        if k > 0:
            cv = self.iteration_noise_cv
            if cv == 0:
                r.noise_sum += k
            elif k <= EXACT_NOISE_DRAWS:
                sigma2 = math.log1p(cv * cv)
                r.noise_sum += float(np.add.reduce(self._noise_rng.lognormal(-0.5 * sigma2, math.sqrt(sigma2), k)))
            else:
                r.noise_sum += max(0.0, k + cv * math.sqrt(k) * float(self._noise_rng.standard_normal()))
            r.noise_n = n
        if r.noise_n == 0:
            return None, 0.0
        return r.iteration_time_s * r.noise_sum / r.noise_n, float(r.noise_n)

    def _push(self, t: float, r: _Run, kind: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, r.job.job_id, r.gen, kind))

    def _start(self, r: _Run, alloc: Allocation, it: float, down: float, is_launch: bool) -> None:
        """Put ``r`` (progress accounted up to now) on ``alloc`` after ``down`` seconds."""
        now = self.now_s
        r.gen += 1
        r.alloc, r.iteration_time_s = alloc, it
        r.measured_from, r.noise_n, r.noise_sum = r.iterations_done, 0, 0.0
        r.busy_until_s, r.downtime_is_launch = now + down, is_launch
        r.rate = r.job.global_batch / it
        if down > 0:
            r.computing = False
            if not is_launch:
                self._down_gpus += alloc.grid.num_gpus
            self._push(r.busy_until_s, r, _DOWN_END)
        else:
            self._begin_computing(r, now)

    def _begin_computing(self, r: _Run, t: float) -> None:
        r.computing = True
        self._rate += r.rate
        self._next_event(r, t)

    def _detach(self, r: _Run) -> None:
        """Remove ``r``'s contribution to the cluster's rates; its pending events go stale."""
        r.gen += 1
        if r.computing:
            self._rate -= r.rate
            r.computing = False
        elif r.busy_until_s > self.now_s and not r.downtime_is_launch:
            self._down_gpus -= r.alloc.grid.num_gpus
        if not self._running:
            self._rate, self._down_gpus = 0.0, 0        # no drift from repeated += / -=

    def _run_until(self, t: float) -> None:
        if t < self.now_s:
            raise RuntimeError(f"executor clock moved backwards: {t} < {self.now_s}")
        if self.now_s == float("-inf"):
            self.now_s = t
        ev = self._events
        while ev and ev[0][0] <= t:
            te, _, jid, gen, kind = heapq.heappop(ev)
            r = self._running.get(jid)
            if r is None or r.gen != gen:
                continue                                # stale
            self._account(te)
            self._progress_to(r, te)
            if kind == _FINISH and r.finished_at_s is None and r.iterations_done >= r.job.num_iterations:
                r.finished_at_s = te                    # nothing was left (stopped within rounding of its finish)
            if kind == _DOWN_END:
                if not r.downtime_is_launch:
                    self._down_gpus -= r.alloc.grid.num_gpus
                self._begin_computing(r, te)
            elif kind == _SEGMENT:
                if r.seg_end is not None:                # float time: land on the boundary
                    r.iterations_done = max(r.iterations_done, r.seg_end)
                self._next_event(r, te)
            elif r.finished_at_s is not None:
                del self._running[jid]
                self._detach(r)
                measured, n = self._measured(r)
                self._carry.append(JobProgress(jid, r.iterations_done, False, True, r.finished_at_s,
                                               last_checkpoint_iteration=r.iterations_done,
                                               measured_iteration_time_s=measured, measured_iterations=n))
                r.alloc = None
            else:                                       # rounding: not quite done yet
                nxt = te + (r.job.num_iterations - r.iterations_done) * r.iteration_time_s
                if not nxt > te:                        # never spin: the finish must be later in float time
                    raise RuntimeError(f"job {jid}: its completion event at {te!r} s cannot move later in float "
                                       f"time (times must stay within instances.limits.MAX_TIME_S)")
                self._push(nxt, r, _FINISH)
        self._account(t)

    def _account(self, t: float) -> None:
        dt = t - self.now_s
        if dt > 0:
            self.samples_done += self._rate * dt
            self.reconfig_lost_gpu_s_total += self._down_gpus * dt
            self.now_s = t

    def _progress_to(self, r: _Run, t: float) -> None:
        """Bring one job's progress and downtime accounting up to ``t`` (per job only)."""
        if t <= r.t_last_s or r.alloc is None:
            r.t_last_s = max(r.t_last_s, t)
            return
        g = r.alloc.grid.num_gpus
        down_end = min(t, r.busy_until_s)
        if down_end > r.t_last_s:
            d = down_end - r.t_last_s
            r.downtime_s += d
            if r.downtime_is_launch:
                r.launch_down_gpu_s += d * g
            else:
                r.reconfig_down_gpu_s += d * g
        work_start = max(r.t_last_s, r.busy_until_s)
        if t > work_start:
            remaining = r.job.num_iterations - r.iterations_done
            finish = work_start + remaining * r.iteration_time_s
            if finish <= t + min(t * 1e-12, 1e-3) + 2 * math.ulp(t):   # within rounding (at most ~1 ms)
                r.iterations_done = float(r.job.num_iterations)
                r.finished_at_s = min(finish, t)
            else:
                r.iterations_done += (t - work_start) / r.iteration_time_s
        r.t_last_s = t
