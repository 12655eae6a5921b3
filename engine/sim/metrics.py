"""Metrics of a simulation: per-job records, per-round records and a flat summary.

Definitions (all times in seconds; "by the horizon" = up to ``t0 + rounds x interval``):

- JCT = completion time - arrival time (true arrival, not the round it was submitted);
  ``avg/median/p95/p99_jct_s`` over the jobs finished by the horizon.
- queueing delay = first start - arrival, averaged over jobs started by the horizon.
- ``makespan_s`` = last completion by the horizon - first arrival.
- active span = the rounds by the horizon up to the end of the round in which the last
  job finished (an idle tail after every job is done is not averaged in, so a run with
  and without run-out, ``arena simulate`` and ``arena bench policies``, report the same
  figures); ``active_span_s`` is its length.
- throughput = samples per second (global batch / true iteration time, summed over jobs
  while they compute; reconfiguration downtime produces nothing), averaged exactly over
  each round interval; ``avg_throughput`` is the mean over the active span's rounds,
  ``peak_throughput`` the largest round.
- GPU utilization of a type = GPU-seconds held by jobs / (GPUs x active span).
- ``reconfigurations``: moves of running jobs plus resumes of preempted jobs, by the
  horizon; ``reconfig_gpu_hours_lost``: GPU-hours held during their downtime.
- ``jobs_never_placed``: submitted jobs that never ran (within the simulated span; with
  run-out: jobs that never ran at all); ``never_placed_reasons`` counts them by reason
  and ``jobs.csv``'s ``never_placed_reason`` says why for each (``never_placed_reason``).
- ``end_reason``: horizon, all jobs finished, stalled (run-out: nothing ran or started
  for ``stall_rounds`` rounds), safety limit (run-out reached ``max_rounds``, reported
  as ``safety_limit_rounds``), clock bound (run-out reached the last round before the
  simulated clock would pass ``instances.limits.MAX_TIME_S``) or interrupted (the
  caller's ``stop``, Ctrl-C in ``arena simulate``: the results up to that round, and
  ``interrupted`` true).
- run-out only: ``avg_jct_runout_s`` over every finished job, ``makespan_runout_s`` =
  completion of the last job - first arrival; ``reconfigurations_runout``,
  ``reconfigurations_per_job_runout`` (over every job of the instance) and
  ``reconfig_gpu_hours_lost_runout`` over the whole run.
- with a shadow policy (``simulate(shadow=...)``, ``arena simulate --shadow-policy``):
  ``shadow_*`` keys (``engine.core.shadow.summarize``) and ``shadow.csv``, one row per round
  the shadow was asked.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engine.core.executor import JobProgress
from engine.core.move_ledger import MoveLedger
from engine.core.round_loop import RoundRecord
from engine.core.shadow import COLUMNS as SHADOW_COLUMNS
from engine.core.shadow import summarize as shadow_summary
from engine.core.state import EngineState
from instances.jobs import Job

TIMING_KEYS = ("decision_time_median_s", "decision_time_p99_s", "decision_time_total_s", "wall_time_s",
               "shadow_decision_time_median_s")


@dataclass(frozen=True)
class JobResult:
    job_id: str
    model: str
    global_batch: int
    num_iterations: int
    arrival_s: float
    requested_gpu_type: str | None
    requested_gpus: int | None
    status: str                        # pending (never submitted), queued, running, finished
    submitted_s: float | None
    first_start_s: float | None
    finish_s: float | None
    jct_s: float | None
    queueing_delay_s: float | None
    iterations_done: float
    launches: int
    reconfigurations: int
    preemptions: int
    attained_gpu_s: float
    launch_lost_gpu_s: float
    reconfig_lost_gpu_s: float
    infeasible_drops: int
    packing_failures: int
    last_grid: str
    never_placed_reason: str = ""      # submitted, never ran: why (see never_placed_reason)
    evictions: int = 0                 # stopped because its node went out of service (outages, drains)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else math.nan


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else math.nan


@dataclass(frozen=True)
class SimRun:
    """A finished simulation, as its metrics read it (``engine.sim.simulator`` builds it)."""
    instance_name: str
    policy_name: str
    perf_name: str | None                 # the performance model the policy decided with (None: none)
    perf_runtime: str | None              # the training runtime that model assumed
    seed: int
    round_interval_s: float               # the round loop's (``RoundLoop.round_interval_s``)
    horizon_rounds: int                   # ``rounds``; == max_rounds: no horizon
    max_rounds: int                       # the run-out safety limit
    run_out: bool
    t0: float                             # the first arrival: round 0
    horizon_s: float                      # t0 + horizon_rounds x round_interval_s
    end_s: float                          # the clock when the run ended
    end_reason: str        # horizon, all jobs finished, stalled, safety limit, clock bound, interrupted
    stopped_by_safety: bool
    wall_s: float
    jobs: Sequence[Job]                   # by arrival, then id
    state: EngineState                    # the round loop's state at the end
    progress: Callable[[str], JobProgress]   # the executor's progress of a job
    rounds: list[RoundRecord]
    moves: MoveLedger


@dataclass
class SimResult:
    summary: dict
    jobs: list                        # JobResult, one per job
    rounds: list                      # simulator.RoundRecord, one per simulated round
    instance_name: str = ""
    policy_name: str = ""
    gpus_by_type: dict = field(default_factory=dict)
    moves: list = field(default_factory=list)   # move_ledger.MoveEntry, one per move of a running job


NEVER_PLACED_KINDS = {          # short label in the summary -> what it means
    "gpu type missing": "requests a GPU type the cluster lacks",
    "too many gpus": "requests more GPUs of its type than the cluster has",
    "infeasible": "every grid the policy chose for it was infeasible at truth",
    "no room": "placement never found free GPUs for the grid the policy chose",
    "never chosen": "the policy never chose a grid for it",
}


def never_placed_reason(job, infeasible_drops: int, packing_failures: int,
                        gpus_by_type: dict[str, int], policy: str = "") -> tuple[str, str]:
    """(kind, sentence) for a submitted job that never ran under ``policy``; kinds are
    NEVER_PLACED_KINDS."""
    t, n = job.requested_gpu_type, job.requested_gpus
    if t is not None and t not in gpus_by_type:
        return "gpu type missing", (f"requests GPU type {t}, which the cluster lacks (it has "
                                    f"{', '.join(sorted(gpus_by_type))})")
    cap = gpus_by_type.get(t, 0) if t is not None else sum(gpus_by_type.values())
    if n is not None and n > cap:
        return "too many gpus", f"requests {n} GPUs{f' of type {t}' if t else ''}; the cluster has {cap}"
    if infeasible_drops:
        return "infeasible", (f"the oracle refused every grid the policy chose for it ({infeasible_drops} "
                              f"times: out of memory or not runnable on that shape)")
    if packing_failures:
        return "no room", (f"placement found no free GPUs for the grid the policy chose "
                           f"({packing_failures} packing failures)")
    if policy == "fcfs":
        return "never chosen", ("fcfs never chose a grid for it (no node layout of the cluster holds its request, "
                                "or it waited behind other jobs until the end)")
    return "never chosen", (f"{policy or 'the policy'} never chose a grid for it (it waited for room until the end, "
                            "or none of its grids fits in the policy's estimate)")


def never_placed_lines(result, limit: int = 20) -> list[str]:
    """Lines for stderr naming each never-placed job and why (at most ``limit`` jobs)."""
    never = [j for j in result.jobs if j.never_placed_reason]
    if not never:
        return []
    reasons = result.summary.get("never_placed_reasons")
    out = [f"{len(never)} job(s) never placed under {result.policy_name} ({reasons}):"]
    out += [f"  job {j.job_id} ({j.model}, batch {j.global_batch}): {j.never_placed_reason}" for j in never[:limit]]
    if len(never) > limit:
        out.append(f"  ... and {len(never) - limit} more (jobs.csv, column never_placed_reason)")
    return out


def build_result(sim: SimRun) -> SimResult:
    st = sim.state
    jobs: list[JobResult] = []
    for j in sim.jobs:
        r = st.jobs[j.job_id]
        p = sim.progress(j.job_id)
        grid = str(r.alloc.grid) if r.alloc else ""
        la, rc = p.launch_lost_gpu_s, p.reconfig_lost_gpu_s
        why = never_placed_reason(j, r.infeasible_drops, r.packing_failures, dict(st.cluster.gpus_by_type),
                                  sim.policy_name)[1] \
            if r.submitted_s is not None and r.first_start_s is None else ""
        jobs.append(JobResult(
            j.job_id, j.model, j.global_batch, j.num_iterations, j.arrival_s, j.requested_gpu_type,
            j.requested_gpus, r.status.value, r.submitted_s, r.first_start_s, r.finish_s,
            (r.finish_s - j.arrival_s) if r.finish_s is not None else None,
            (r.first_start_s - j.arrival_s) if r.first_start_s is not None else None,
            max(r.iterations_done, p.iterations_done), r.launches, r.reconfigurations, r.preemptions,
            st.attained_gpu_s_at(r, sim.end_s), la, rc, r.infeasible_drops, r.packing_failures, grid, why,
            r.evictions))
    summary = summarize(sim, jobs)
    return SimResult(summary, jobs, list(sim.rounds), sim.instance_name, sim.policy_name,
                     dict(st.cluster.gpus_by_type), list(sim.moves.entries))


def summarize(sim: SimRun, jobs: list[JobResult]) -> dict:
    H = sim.horizon_s
    t0 = sim.t0
    I = sim.round_interval_s
    hrounds = [r for r in sim.rounds if r.index < sim.horizon_rounds]
    # the active span: up to the round in which every job had finished (no idle tail)
    all_done = next((r.index for r in sim.rounds if r.finished_total == len(jobs)), None)
    active = [r for r in hrounds if all_done is None or r.index < all_done]
    fin_h = [j for j in jobs if j.finish_s is not None and j.finish_s <= H + 1e-9]
    jct_h = [j.jct_s for j in fin_h]
    started_h = [j.queueing_delay_s for j in jobs if j.first_start_s is not None and j.first_start_s <= H + 1e-9]
    submitted = [j for j in jobs if j.submitted_s is not None]
    never = [j for j in submitted if j.first_start_s is None]
    kinds: dict[str, int] = {}
    for j in never:
        kind = never_placed_reason(j, j.infeasible_drops, j.packing_failures, dict(sim.state.cluster.gpus_by_type))[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    thr = [r.throughput_samples_per_s for r in active]
    dec = [r.decision_time_s for r in sim.rounds if r.decided]
    s: dict = {
        "instance": sim.instance_name,
        "policy": sim.policy_name,
        "perf": sim.perf_name,              # what the policy decided with (None: no model)
        "perf_runtime": sim.perf_runtime,   # the training runtime it assumed
        "seed": sim.seed,
        "round_interval_s": I,
        "horizon_rounds": sim.horizon_rounds if sim.horizon_rounds < sim.max_rounds else None,   # None: no horizon
        "rounds_simulated": len(sim.rounds),
        "run_out": sim.run_out,
        "jobs_total": len(jobs),
        "jobs_submitted": sum(1 for j in jobs if j.submitted_s is not None and j.submitted_s <= H + 1e-9),
        "jobs_finished": len(fin_h),
        "jobs_never_placed": len(never),
        "never_placed_reasons": "; ".join(f"{k}: {n}" for k, n in kinds.items()),
        "avg_jct_s": _mean(jct_h),
        "median_jct_s": _pct(jct_h, 50),
        "p95_jct_s": _pct(jct_h, 95),
        "p99_jct_s": _pct(jct_h, 99),
        "avg_queueing_delay_s": _mean(started_h),
        "makespan_s": (max(j.finish_s for j in fin_h) - t0) if fin_h else math.nan,
        "avg_throughput": _mean(thr),
        "peak_throughput": max(thr) if thr else math.nan,
        "reconfigurations": sum(r.reconfigurations for r in hrounds),
        "preemptions": sum(r.preemptions for r in hrounds),
        "evictions": sum(r.evictions for r in hrounds),
        "reconfigurations_per_job": (sum(r.reconfigurations for r in hrounds) / len(submitted)) if submitted else 0.0,
        "reconfig_gpu_hours_lost": sum(r.reconfig_lost_gpu_s for r in hrounds) / 3600.0,
        "decision_time_median_s": _pct(dec, 50),
        "decision_time_p99_s": _pct(dec, 99),
        "decision_time_total_s": float(sum(dec)),
        "rounds_decided": len(dec),
        "packing_failures": sum(r.packing_failures for r in hrounds),
        "packing_repairs": sum(r.repairs for r in hrounds),
        "placement_refines": sum(r.refines for r in hrounds),
        "rounds_refined": sum(1 for r in hrounds if r.refines),
        "fallbacks": sum(r.fallbacks for r in hrounds),
        "fallback_waits": sum(r.fallback_waits for r in hrounds),
        "rounds_with_fallbacks": sum(1 for r in hrounds if r.fallbacks or r.fallback_waits),
        "displaced_by_drops": sum(r.displaced for r in hrounds),
        "infeasible_drops": sum(r.infeasible_drops for r in hrounds),
        "end_reason": sim.end_reason,
        "wall_time_s": sim.wall_s,
    }
    if sim.end_reason == "interrupted":
        s["interrupted"] = True
    caps = sim.state.cluster.gpus_by_type
    span = len(active) * I
    s["active_span_s"] = span
    for t, n in sorted(caps.items()):
        busy = sum(r.gpu_busy_s.get(t, 0.0) for r in active)
        s[f"gpu_util_{t}"] = busy / (n * span) if span > 0 else math.nan
    total = sum(caps.values())
    s["gpu_util"] = (sum(sum(r.gpu_busy_s.values()) for r in active) / (total * span)) if span > 0 else math.nan
    if sim.run_out:
        fin = [j for j in jobs if j.finish_s is not None]
        s["jobs_finished_runout"] = len(fin)
        s["jobs_unfinished_runout"] = len(jobs) - len(fin)
        s["avg_jct_runout_s"] = _mean(j.jct_s for j in fin)
        s["median_jct_runout_s"] = _pct([j.jct_s for j in fin], 50)
        s["p99_jct_runout_s"] = _pct([j.jct_s for j in fin], 99)
        s["makespan_runout_s"] = (max(j.finish_s for j in fin) - t0) if fin else math.nan
        s["avg_queueing_delay_runout_s"] = _mean(j.queueing_delay_s for j in jobs if j.queueing_delay_s is not None)
        s["reconfigurations_runout"] = sum(r.reconfigurations for r in sim.rounds)
        s["reconfigurations_per_job_runout"] = s["reconfigurations_runout"] / len(jobs) if jobs else 0.0
        s["reconfig_gpu_hours_lost_runout"] = sum(r.reconfig_lost_gpu_s for r in sim.rounds) / 3600.0
        s["stopped_by_safety"] = sim.stopped_by_safety
        s["safety_limit_rounds"] = sim.max_rounds
    s.update(sim.moves.summary())      # what the moves expected and gave (engine/core/move_ledger.py)
    s.update(shadow_summary(sim.rounds))    # a shadow policy's agreement, when one was asked (engine/core/shadow.py)
    return s


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_result(result, out_dir) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.json", out / "jobs.csv", out / "rounds.csv", out / "moves.csv"]
    paths[0].write_text(json.dumps({k: _clean(v) for k, v in result.summary.items()}, indent=2) + "\n")
    with paths[1].open("w", newline="") as f:
        fields = list(JobResult.__dataclass_fields__)
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for j in result.jobs:
            w.writerow({k: ("" if v is None else v) for k, v in asdict(j).items()})
    types = sorted({t for r in result.rounds for t in r.gpu_busy_s})
    with paths[2].open("w", newline="") as f:
        base = [k for k in result.rounds[0].__dataclass_fields__ if k not in ("gpu_busy_s", "shadow")] \
            if result.rounds else []
        w = csv.writer(f)
        w.writerow(base + [f"gpu_busy_s_{t}" for t in types])
        for r in result.rounds:
            w.writerow([getattr(r, k) for k in base] + [r.gpu_busy_s.get(t, 0.0) for t in types])
    from engine.core.move_ledger import COLUMNS as MOVE_COLUMNS
    with paths[3].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(MOVE_COLUMNS))
        w.writeheader()
        for e in result.moves:
            w.writerow({k: ("" if v is None else v) for k, v in e.row().items()})
    compared = [r for r in result.rounds if r.shadow is not None]
    if compared:
        paths.append(out / "shadow.csv")
        with paths[-1].open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(SHADOW_COLUMNS))
            w.writeheader()
            for r in compared:
                w.writerow({"round": r.index, "time_s": r.time_s,
                            **{k: ("" if v is None else v) for k, v in r.shadow.row().items()}})
    return paths


def format_summary(summary: dict) -> str:
    """A two-column table for the terminal."""
    rows = []
    for k, v in summary.items():
        if isinstance(v, float):
            v = "n/a" if not math.isfinite(v) else (f"{v:,.4f}" if abs(v) < 10 else f"{v:,.1f}")
        rows.append((k, str(v)))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
