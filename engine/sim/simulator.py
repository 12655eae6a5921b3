"""Round-based, event-driven cluster simulator: the round loop (engine/core/round_loop.py)
driven by a virtual clock, with ``SimExecutor`` as the executor.

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
continues, submitting every remaining arrival, until all jobs finish. Three safety stops
end a run-out early, and the summary says which (``end_reason``): a stall (nothing runs,
nothing is left to arrive and the policy starts nothing for ``stall_rounds`` rounds),
the safety limit of ``max_rounds`` rounds, which also bounds memory (every round keeps a
``RoundRecord`` of about 0.5 kB), and the clock bound: the simulated clock never passes
``instances.limits.MAX_TIME_S`` (9e12 s; past it float time loses millisecond
precision), so a run-out ends at the last round before it (``clock bound``), and a
horizon that would pass it is refused (``InputError`` on ``rounds``). A caller's ``stop``
(``arena simulate`` sets it on Ctrl-C) ends the run before the next round
(``interrupted``). The jobs left are reported as never placed or unfinished, never
dropped. A round whose clock did not advance past the previous one raises (never spins).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from engine.core.policy import Policy
from engine.core.reconfig import ReconfigCostModel
from engine.core.round_loop import RoundLoop, RoundRecord
from estimators.base import PerformanceModel
from instances.cluster import ClusterSpec
from instances.errors import InputError
from instances.jobs import Job
from instances.limits import MAX_TIME_S, TIME_BOUND, check_time
from instances.oracle import Oracle
from instances.outages import Outage, down_at

from . import metrics
from .sim_executor import DEFAULT_ITERATION_NOISE_CV, SimExecutor

# The run-out's default safety limit, in rounds (SimConfig.max_rounds, --max-rounds).
MAX_ROUNDS = 1_000_000


@dataclass(frozen=True)
class SimConfig:
    round_interval_s: float = 300.0
    rounds: int = 2000                  # horizon, in rounds
    run_out: bool = False
    seed: int = 0
    stall_rounds: int = 20              # run-out safety stop
    # run-out safety limit: ~9.5 simulated years at 300 s, ~0.5 GB of round records
    # (arena-philly's run-out, the longest bundled one, takes 86,411 rounds)
    max_rounds: int = MAX_ROUNDS
    check_invariants: bool = True
    iteration_noise_cv: float = DEFAULT_ITERATION_NOISE_CV   # jitter of measured iteration times (SimExecutor)
    outages: tuple[Outage, ...] = ()    # nodes out of service over time (instances/outages.py)

    def __post_init__(self):
        if not self.round_interval_s > 0:
            raise ValueError(f"round_interval_s must be > 0, got {self.round_interval_s!r}")
        check_time(self.round_interval_s, field="round_interval_s")
        if not isinstance(self.rounds, int) or self.rounds < 0:
            raise ValueError(f"rounds must be an integer >= 0, got {self.rounds!r}")
        if self.stall_rounds < 1 or self.max_rounds < 1:
            raise ValueError("stall_rounds and max_rounds must be >= 1")
        if self.rounds > self.max_rounds:
            raise InputError(f"the horizon of {self.rounds:,} rounds exceeds the safety limit of {self.max_rounds:,} "
                             f"rounds (raise it with --max-rounds)", field="rounds")


class SimInstance(Protocol):
    """What a simulation runs (``instances.builtin.Instance`` is one)."""
    name: str
    cluster: ClusterSpec
    jobs: Sequence[Job]
    oracle: Oracle                      # the truth: iteration times and what fits
    round_interval_s: float             # the default round interval
    horizon_rounds: int | None          # the default horizon (None: run until every job is done)


@dataclass
class RoundProgress:
    round_index: int
    horizon_rounds: int
    run_out: bool
    jobs_finished: int
    jobs_total: int
    elapsed_s: float
    max_rounds: int = SimConfig.max_rounds     # the safety limit (horizon_rounds == it: no horizon)


def simulate(instance: SimInstance, policy: Policy, *, perf: PerformanceModel | None = None,
             reconfig: ReconfigCostModel | None = None,
             rounds: int | None = None, run_out: bool = False, seed: int = 0,
             progress: Callable[[RoundProgress], None] | None = None, out_dir: str | Path | None = None,
             round_interval_s: float | None = None, stall_rounds: int = 20,
             check_invariants_every_round: bool = True, max_rounds: int | None = None,
             iteration_noise_cv: float = DEFAULT_ITERATION_NOISE_CV,
             outages: tuple[Outage, ...] = (), shadow: Policy | None = None,
             stop: Callable[[], bool] | None = None) -> metrics.SimResult:
    """Simulate ``policy`` on ``instance`` (cluster, jobs, oracle); see the module doc.
    ``max_rounds``: the run-out safety limit (default ``SimConfig.max_rounds``).
    ``outages``: nodes out of service over time; at each round the nodes out then are
    unavailable and the jobs on a node that just went out are evicted (``RoundLoop.set_unavailable``).
    ``shadow``: a second policy asked every round beside ``policy`` and compared, never
    carried out (engine/core/shadow.py; ``shadow.csv`` and the ``shadow_*`` summary keys).
    ``stop``: asked before every round; when it answers true the run ends there with the
    results so far (``end_reason`` ``interrupted``)."""

    max_rounds = SimConfig.max_rounds if max_rounds is None else max_rounds
    if rounds is None:
        rounds = instance.horizon_rounds
    if rounds is None:                  # no horizon: run until every job is done
        rounds, run_out = max_rounds, True
    cfg = SimConfig(round_interval_s=float(round_interval_s if round_interval_s is not None
                                           else instance.round_interval_s),
                    rounds=int(rounds), run_out=run_out, seed=seed, stall_rounds=stall_rounds,
                    max_rounds=max_rounds, check_invariants=check_invariants_every_round,
                    iteration_noise_cv=iteration_noise_cv, outages=tuple(outages))
    reconfig = reconfig or ReconfigCostModel()
    run = _Simulation(instance, policy, perf, reconfig, cfg, progress, shadow, stop).run()
    result = metrics.build_result(run)
    if out_dir is not None:
        metrics.write_result(result, out_dir)
        from . import plots
        plots.write_plots(result, out_dir)
    return result


class _Simulation:
    """The virtual-clock driver of the round loop: round ``k`` at ``t0 + k x interval``."""

    def __init__(self, instance: SimInstance, policy: Policy, perf: PerformanceModel | None,
                 reconfig: ReconfigCostModel, cfg: SimConfig, progress: Callable[[RoundProgress], None] | None,
                 shadow: Policy | None = None, stop: Callable[[], bool] | None = None):
        self.instance, self.policy, self.cfg = instance, policy, cfg
        self.progress_cb = progress
        self.stop = stop
        self.jobs = sorted(instance.jobs, key=lambda j: (j.arrival_s, j.job_id))
        self.t0 = self.jobs[0].arrival_s if self.jobs else 0.0
        # the rounds before the clock would pass the bound on times (arrivals are within it)
        # (a ratio past any round count, e.g. an interval of 1e-300 s, is capped before floor(): no overflow;
        # the resolution check below refuses such an interval)
        clock_rounds = max(0, math.floor(min((MAX_TIME_S - self.t0) / cfg.round_interval_s, 2.0**62)))
        if clock_rounds < 1:
            raise InputError(f"a round interval of {cfg.round_interval_s:g} s from the first arrival at {self.t0:g} s "
                             f"leaves no round before the bound on times: every time {TIME_BOUND}",
                             field="round_interval_s")
        has_horizon = not cfg.run_out or cfg.rounds < cfg.max_rounds
        if has_horizon and cfg.rounds > clock_rounds:
            raise InputError(f"a horizon of {cfg.rounds:,} rounds of {cfg.round_interval_s:g} s from the first "
                             f"arrival at {self.t0:g} s would take the simulated clock to "
                             f"{self.t0 + cfg.rounds * cfg.round_interval_s:.4g} s, past the bound on times: "
                             f"every time {TIME_BOUND}; give at most {clock_rounds:,} rounds", field="rounds")
        self.round_limit = min(cfg.max_rounds, clock_rounds)   # a run-out's last round
        last_s = self.t0 + (self.round_limit if cfg.run_out else cfg.rounds) * cfg.round_interval_s
        if cfg.round_interval_s < 4 * math.ulp(last_s):         # rounds that float time cannot tell apart
            raise InputError(f"a round interval of {cfg.round_interval_s:g} s is below what float time resolves at "
                             f"the simulated clock's last round ({last_s:.4g} s): give at least "
                             f"{4 * math.ulp(last_s):.3g} s", field="round_interval_s")
        self.executor = SimExecutor(instance.oracle, reconfig, iteration_noise_cv=cfg.iteration_noise_cv,
                                    seed=cfg.seed)
        self.loop = RoundLoop(instance.cluster, policy, self.executor, perf=perf, reconfig=reconfig,
                              round_interval_s=cfg.round_interval_s, jobs=self.jobs, seed=cfg.seed,
                              check_invariants=cfg.check_invariants, shadow=shadow)
        self.state = self.loop.state
        self.state.cluster.check_nodes(o.node for o in cfg.outages)      # before the first round
        self.rounds: list[RoundRecord] = self.loop.rounds
        self.horizon_s = self.t0 + cfg.rounds * cfg.round_interval_s
        self.end_s = self.horizon_s
        self.stopped_by_safety = False
        # horizon | all jobs finished | stalled | safety limit | clock bound | interrupted
        self.end_reason = ""

    def run(self) -> metrics.SimRun:
        cfg, st, loop = self.cfg, self.state, self.loop
        I = loop.round_interval_s
        next_arrival = 0
        stall = 0
        # the times an outage begins or ends: the nodes out change only there
        changes = sorted({o.start_s for o in cfg.outages} | {o.end_s for o in cfg.outages if o.end_s < math.inf})
        next_change = 0
        last_return = max((o.end_s for o in cfg.outages if o.end_s < math.inf), default=-math.inf)
        start_wall = time.perf_counter()
        k = 0
        prev_now = -math.inf
        while True:
            now = self.t0 + k * I
            if not now > prev_now:          # never spin: float time must move on every round
                raise RuntimeError(f"the simulated clock did not advance at round {k} ({now!r} s after {prev_now!r} "
                                   f"s): times must stay within instances.limits.MAX_TIME_S")
            prev_now = now
            loop.collect(now)
            # stop?
            if self.stop is not None and self.stop():
                self.end_s, self.end_reason = now, "interrupted"
                break
            if k >= cfg.rounds and not cfg.run_out:
                self.end_s, self.end_reason = now, "horizon"
                break
            if cfg.run_out:
                all_in = next_arrival >= len(self.jobs)
                if all_in and not st.running and not st.queued:
                    self.end_s, self.end_reason = now, "all jobs finished"
                    break
                if k >= self.round_limit:
                    self.stopped_by_safety = True
                    self.end_s = now
                    self.end_reason = "safety limit" if self.round_limit == cfg.max_rounds else "clock bound"
                    break
            if next_change < len(changes) and now >= changes[next_change]:    # an outage began or ended
                while next_change < len(changes) and changes[next_change] <= now:
                    next_change += 1
                down = down_at(cfg.outages, now)
                if down != st.cluster.unavailable:
                    loop.set_unavailable(down, now)
            n_sub = 0
            while next_arrival < len(self.jobs) and self.jobs[next_arrival].arrival_s <= now:
                loop.submit(self.jobs[next_arrival].job_id, now)
                next_arrival += 1
                n_sub += 1
            rec = loop.round(now, k, submitted=n_sub)
            if (cfg.run_out and next_arrival >= len(self.jobs) and not st.running and rec.launches == 0
                    and not now < last_return):           # a node is still to come back: wait
                stall += 1
                if stall >= cfg.stall_rounds:
                    self.stopped_by_safety = True
                    self.end_s, self.end_reason = now + I, "stalled"
                    self.executor.advance(now + I)
                    rec.throughput_samples_per_s = 0.0
                    rec.gpu_busy_s = {t: 0.0 for t in st.cluster.gpus_by_type}
                    break
            else:
                stall = 0
            k += 1
            if self.progress_cb is not None:
                self.progress_cb(RoundProgress(k, cfg.rounds, cfg.run_out, len(st.finished_ids),
                                               len(self.jobs), time.perf_counter() - start_wall,
                                               cfg.max_rounds))
        loop.moves.close_all(self.end_s, {j: self.executor.progress(j).iterations_done for j in st.running})
        return metrics.SimRun(
            instance_name=self.instance.name, policy_name=self.policy.name,
            perf_name=getattr(loop.perf, "name", None), perf_runtime=getattr(loop.perf, "runtime", None),
            seed=cfg.seed, round_interval_s=I, horizon_rounds=cfg.rounds, max_rounds=cfg.max_rounds,
            run_out=cfg.run_out, t0=self.t0, horizon_s=self.horizon_s, end_s=self.end_s, end_reason=self.end_reason,
            stopped_by_safety=self.stopped_by_safety, wall_s=time.perf_counter() - start_wall, jobs=self.jobs,
            state=st, progress=self.executor.progress, rounds=self.rounds, moves=loop.moves)
