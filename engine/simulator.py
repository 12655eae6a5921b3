"""Round-based, event-driven cluster simulator.

Time starts at the first job's arrival ``t0``; round ``k`` happens at
``t0 + k * round_interval_s``. At each round, in order:

1. the executor advances to the round time: jobs that completed meanwhile finish at
   their exact completion time and free their GPUs (the round reuses them);
2. jobs that arrived since the previous round are submitted (a job arriving within a
   round waits until the next round start, as in Arena's simulator; its JCT still counts
   from its true arrival);
3. the policy reads a ``RoundContext`` of every active job and returns ``Decisions``;
4. decisions on shapes the oracle calls infeasible are dropped (a running job keeps
   its current allocation, a queued one waits) and counted; the shape is then shown to
   policies in ``JobView.known_infeasible_shapes``;
5. placement maps grids to GPUs; jobs it cannot place are packing failures (a running
   job then keeps its current GPUs when they are still free, else it is stopped).
   Packing failures measure the decision as the policy made it: when step 4 kept a
   running job in place, the GPUs the policy had freed may be missing for others; jobs
   that fail only for that reason are counted as ``displaced``, not as packing failures;
6. the executor stops, reconfigures and launches; reconfiguration downtime is charged
   by the one ``ReconfigCostModel`` shared by all policies;
7. invariants are asserted and the round recorded.

The horizon is ``rounds`` (default: the instance's ``horizon_rounds``); everything up to
``t0 + rounds * round_interval_s`` is "by the horizon". With ``run_out`` the simulation
continues, submitting every remaining arrival, until all jobs finish. Two safety stops
end a run-out early, and the summary says which (``end_reason``): a stall (nothing runs,
nothing is left to arrive and the policy starts nothing for ``stall_rounds`` rounds) and
the safety limit of ``max_rounds`` rounds, which also bounds memory (every round keeps a
``RoundRecord`` of about 0.5 kB). The jobs left are reported as never placed or
unfinished, never dropped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from instances.grid import Grid

from .context import Decisions, JobView, RoundContext
from .invariants import check_invariants
from .placement import Placer
from .reconfig import ReconfigCostModel
from .sim_executor import SimExecutor
from .state import JobStatus, SimState


@dataclass(frozen=True)
class SimConfig:
    round_interval_s: float = 300.0
    rounds: int = 2000                  # horizon, in rounds
    run_out: bool = False
    seed: int = 0
    stall_rounds: int = 20              # run-out safety stop
    # run-out safety limit: ~9.5 simulated years at 300 s, ~0.5 GB of round records
    # (arena-philly's run-out, the longest bundled one, takes 86,411 rounds)
    max_rounds: int = 1_000_000
    check_invariants: bool = True

    def __post_init__(self):
        if not self.round_interval_s > 0:
            raise ValueError(f"round_interval_s must be > 0, got {self.round_interval_s!r}")
        if not isinstance(self.rounds, int) or self.rounds < 0:
            raise ValueError(f"rounds must be an integer >= 0, got {self.rounds!r}")
        if self.stall_rounds < 1 or self.max_rounds < 1:
            raise ValueError("stall_rounds and max_rounds must be >= 1")
        if self.rounds > self.max_rounds:
            raise ValueError(f"rounds ({self.rounds}) exceeds the safety limit max_rounds ({self.max_rounds})")


@dataclass
class RoundRecord:
    index: int
    time_s: float
    submitted: int = 0               # jobs submitted this round
    queued: int = 0                  # after the decision
    running: int = 0
    finished_total: int = 0
    launches: int = 0
    reconfigurations: int = 0        # moves of running jobs and resumes of preempted ones
    preemptions: int = 0
    infeasible_drops: int = 0
    packing_failures: int = 0        # chosen grids placement could not map to GPUs, as decided
    displaced: int = 0               # left waiting because a truth-rejected move kept its GPUs
    repairs: int = 0
    decision_time_s: float = 0.0
    decided: bool = False            # the policy was called this round
    # over the interval [time_s, time_s + round_interval_s), filled at the next round:
    throughput_samples_per_s: float = 0.0
    gpu_busy_s: dict = field(default_factory=dict)       # per GPU type, GPU-seconds held
    reconfig_lost_gpu_s: float = 0.0


@dataclass
class RoundProgress:
    round_index: int
    horizon_rounds: int
    run_out: bool
    jobs_finished: int
    jobs_total: int
    elapsed_s: float
    max_rounds: int = SimConfig.max_rounds     # the safety limit (horizon_rounds == it: no horizon)


@dataclass
class SimResult:
    summary: dict
    jobs: list                        # metrics.JobResult, one per job
    rounds: list                      # RoundRecord, one per simulated round
    instance_name: str = ""
    policy_name: str = ""
    gpus_by_type: dict = field(default_factory=dict)


def simulate(instance: Any, policy: Any, *, perf: Any = None, reconfig: ReconfigCostModel | None = None,
             rounds: int | None = None, run_out: bool = False, seed: int = 0,
             progress: Callable[[RoundProgress], None] | None = None, out_dir: str | Path | None = None,
             round_interval_s: float | None = None, stall_rounds: int = 20,
             check_invariants_every_round: bool = True, max_rounds: int | None = None) -> SimResult:
    """Simulate ``policy`` on ``instance`` (cluster, jobs, oracle); see the module doc.
    ``max_rounds``: the run-out safety limit (default ``SimConfig.max_rounds``)."""
    from . import metrics

    max_rounds = SimConfig.max_rounds if max_rounds is None else max_rounds
    if rounds is None:
        rounds = getattr(instance, "horizon_rounds", None)
    if rounds is None:                  # no horizon: run until every job is done
        rounds, run_out = max_rounds, True
    cfg = SimConfig(round_interval_s=float(round_interval_s if round_interval_s is not None
                                           else getattr(instance, "round_interval_s", 300.0)),
                    rounds=int(rounds), run_out=run_out, seed=seed, stall_rounds=stall_rounds,
                    max_rounds=max_rounds, check_invariants=check_invariants_every_round)
    reconfig = reconfig or ReconfigCostModel()
    sim = _Simulation(instance, policy, perf, reconfig, cfg, progress)
    sim.run()
    result = metrics.build_result(sim)
    if out_dir is not None:
        metrics.write_result(result, out_dir)
        from . import plots
        plots.write_plots(result, out_dir)
    return result


class _Simulation:
    def __init__(self, instance, policy, perf, reconfig: ReconfigCostModel, cfg: SimConfig, progress):
        self.instance, self.policy, self.perf, self.reconfig, self.cfg = instance, policy, perf, reconfig, cfg
        self.progress_cb = progress
        self.cluster = instance.cluster
        self.jobs = sorted(instance.jobs, key=lambda j: (j.arrival_s, j.job_id))
        self.state = SimState(self.cluster, self.jobs)
        self.executor = SimExecutor(instance.oracle, reconfig)
        self.placer = Placer(self.cluster)
        self.t0 = self.jobs[0].arrival_s if self.jobs else 0.0
        self.rounds: list[RoundRecord] = []
        self.horizon_s = self.t0 + cfg.rounds * cfg.round_interval_s
        self.end_s = self.horizon_s
        self.stopped_by_safety = False
        self.end_reason = ""            # horizon | all jobs finished | stalled | safety limit
        self.wall_s = 0.0

    # ------------------------------------------------------------------------------
    def run(self) -> None:
        cfg, st, ex = self.cfg, self.state, self.executor
        I = cfg.round_interval_s
        next_arrival = 0
        stall = 0
        prev_now = None
        start_wall = time.perf_counter()
        gpu_types = list(st.cluster.gpus_by_type)
        busy_by_type = {t: 0 for t in gpu_types}      # GPUs held, per type, since the last round
        samples_prev = 0.0
        reconfig_lost_prev = 0.0
        # A policy with ``event_driven = True`` declares that its decisions change only when
        # the set of jobs changes (arrival, completion) or when its last decisions were not
        # all carried out; in other rounds it is not called and nothing moves.
        event_driven = bool(getattr(self.policy, "event_driven", False))
        need_decide = True
        checked_version = -1
        prev_iters: dict[str, float] = {}
        k = 0
        while True:
            now = self.t0 + k * I
            st.set_time(now)
            # 1. completions up to now
            finished = ex.advance(now)
            freed_after: dict[str, float] = {t: 0.0 for t in gpu_types}
            for p in finished:
                r = st.jobs[p.job_id]
                gt, g = r.alloc.grid.gpu_type, r.alloc.grid.num_gpus
                freed_after[gt] += (now - p.finished_at_s) * g
                st.set_progress(p.job_id, p.iterations_done)
                st.finish(p.job_id, p.finished_at_s)
            if self.rounds:
                rec = self.rounds[-1]
                rec.throughput_samples_per_s = (ex.samples_done - samples_prev) / I
                rec.gpu_busy_s = {t: busy_by_type[t] * I - freed_after[t] for t in gpu_types}
                lost = ex.reconfig_lost_gpu_s_total
                rec.reconfig_lost_gpu_s = lost - reconfig_lost_prev
                reconfig_lost_prev = lost
            samples_prev = ex.samples_done
            # stop?
            if k >= cfg.rounds and not cfg.run_out:
                self.end_s, self.end_reason = now, "horizon"
                break
            if cfg.run_out:
                all_in = next_arrival >= len(self.jobs)
                if all_in and not st.running and not st.queued:
                    self.end_s, self.end_reason = now, "all jobs finished"
                    break
                if k >= cfg.max_rounds:
                    self.stopped_by_safety = True
                    self.end_s, self.end_reason = now, "safety limit"
                    break
            # 2. arrivals
            n_sub = 0
            while next_arrival < len(self.jobs) and self.jobs[next_arrival].arrival_s <= now:
                st.submit(self.jobs[next_arrival].job_id, now)
                next_arrival += 1
                n_sub += 1
            rec = RoundRecord(k, now, submitted=n_sub)
            if finished or n_sub:
                need_decide = True
            if need_decide or not event_driven:
                # 3. decide
                for jid in st.running:
                    st.set_progress(jid, ex.iterations_done(jid))
                ctx = self._context(now, k)
                t_dec = time.perf_counter()
                decisions = self.policy.decide(ctx)
                rec.decision_time_s = time.perf_counter() - t_dec
                rec.decided = True
                # 4-6. filter, place, apply
                self._apply(decisions, now, rec)
                busy_by_type = st.cluster.used_by_type()
                # an event-driven policy is asked again only after an event, or when this
                # round's decisions were not all carried out
                need_decide = bool(rec.infeasible_drops or rec.packing_failures or rec.displaced)
            elif finished:
                busy_by_type = st.cluster.used_by_type()
            rec.queued, rec.running, rec.finished_total = len(st.queued), len(st.running), len(st.finished_ids)
            # 7. invariants
            if cfg.check_invariants:
                gpus_changed = st.cluster.version != checked_version
                check_invariants(st, now, prev_now, prev_iters if gpus_changed else None, gpus=gpus_changed)
                if gpus_changed:
                    checked_version = st.cluster.version
                    prev_iters = {j: r.iterations_done for j, r in st.running.items()}
            prev_now = now
            self.rounds.append(rec)
            if cfg.run_out and next_arrival >= len(self.jobs) and not st.running and rec.launches == 0:
                stall += 1
                if stall >= cfg.stall_rounds:
                    self.stopped_by_safety = True
                    self.end_s, self.end_reason = now + I, "stalled"
                    ex.advance(now + I)
                    self.rounds[-1].throughput_samples_per_s = 0.0
                    self.rounds[-1].gpu_busy_s = {t: 0.0 for t in gpu_types}
                    break
            else:
                stall = 0
            k += 1
            if self.progress_cb is not None:
                self.progress_cb(RoundProgress(k, cfg.rounds, cfg.run_out, len(st.finished_ids),
                                               len(self.jobs), time.perf_counter() - start_wall,
                                               cfg.max_rounds))
        self.wall_s = time.perf_counter() - start_wall

    # ------------------------------------------------------------------------------
    def _context(self, now: float, k: int) -> RoundContext:
        st, ex = self.state, self.executor
        views = []
        for r in st.running.values():
            views.append(JobView(r.job, r.job.num_iterations - r.iterations_done, r.alloc,
                                 st.attained_gpu_s_at(r, now), r.queued_s, r.reconfigurations,
                                 ex.iteration_time_s(r.job_id), r.known_infeasible))
        for r in st.queued.values():
            views.append(JobView(r.job, r.job.num_iterations - r.iterations_done, None,
                                 r.attained_gpu_s, st.queued_s_at(r, now), r.reconfigurations,
                                 None, r.known_infeasible))
        views.sort(key=lambda v: (v.job.arrival_s, v.job.job_id))
        return RoundContext(now, k, self.cfg.round_interval_s, self.cluster, tuple(views), self.perf,
                            self.reconfig, self.cfg.seed)

    def _apply(self, decisions: Decisions, now: float, rec: RoundRecord) -> None:
        st, ex = self.state, self.executor
        if not isinstance(decisions, Decisions):
            raise TypeError(f"policy {getattr(self.policy, 'name', self.policy)!r} returned "
                            f"{type(decisions).__name__}, not Decisions")
        requests: dict[str, Grid] = {}
        dropped: dict[str, Grid] = {}     # running jobs whose decided move was rejected at truth
        for jid, grid in decisions.grids.items():
            r = st.jobs.get(jid)
            if r is None or r.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
                raise ValueError(f"policy decided for job {jid!r}, which is "
                                 f"{'unknown' if r is None else r.status.value}")
            if not isinstance(grid, Grid):
                raise TypeError(f"policy decision for job {jid!r} is {grid!r}, not a Grid")
            if (r.alloc is None or r.alloc.grid.shape != grid.shape) and \
                    ex.true_iteration_time(r.job, grid.shape) is None:
                rec.infeasible_drops += 1
                r.infeasible_drops += 1
                r.known_infeasible = r.known_infeasible | {grid.shape}
                if r.alloc is not None:
                    requests[jid] = r.alloc.grid      # keep running where it is
                    dropped[jid] = grid
                continue
            requests[jid] = grid
        current = {jid: r.alloc for jid, r in st.running.items()}
        pinned = {j: g for j, g in decisions.placements.items() if j in requests and j not in dropped}
        res = self.placer.place(requests, current, pinned)
        failed = set(res.failed)
        if dropped and failed:
            # which failures are the decision's own: place it as decided (dropped moves included)
            as_decided = self.placer.place({**requests, **dropped}, current,
                                           {j: g for j, g in decisions.placements.items() if j in requests})
            own = failed & set(as_decided.failed)
        else:
            own = failed
        rec.packing_failures = len(own)
        rec.displaced = len(failed - own)
        rec.repairs = res.repaired
        for jid in own:
            st.jobs[jid].packing_failures += 1
        allocs = dict(res.allocations)
        # a running job whose new grid did not fit stays where it is, if its GPUs are still free
        stuck = [j for j in res.failed if j in current]
        if stuck:
            taken = {g for a in allocs.values() for g in a.gpus}
            for jid in stuck:
                if taken.isdisjoint(current[jid].gpus):
                    allocs[jid] = current[jid]
                    taken.update(current[jid].gpus)
        # stops: running jobs with no allocation this round
        for jid in [j for j in st.running if j not in allocs]:
            ex.stop(jid, now)
            st.stop(jid, now)
            rec.preemptions += 1
        # moves: release first, then assign
        moving = [(jid, a) for jid, a in allocs.items()
                  if jid in st.running and (a.gpus != st.running[jid].alloc.gpus or a.grid != st.running[jid].alloc.grid)]
        for jid, _ in moving:
            st.release_for_move(jid)
        for jid, a in moving:
            st.move(jid, a, now)
            ex.reconfigure(jid, a, decisions.plans.get(jid), now)
            rec.reconfigurations += 1
        # launches
        for jid, a in allocs.items():
            r = st.jobs[jid]
            if r.status is JobStatus.QUEUED:
                resumed = r.first_start_s is not None
                st.start(jid, a, now)
                ex.launch(r.job, a, decisions.plans.get(jid), now)
                rec.launches += 1
                if resumed:
                    rec.reconfigurations += 1
