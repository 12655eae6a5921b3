"""Metrics of a simulation: per-job records, per-round records and a flat summary.

Definitions (all times in seconds; "by the horizon" = up to ``t0 + rounds x interval``):

- JCT = completion time - arrival time (true arrival, not the round it was submitted);
  ``avg/median/p95/p99_jct_s`` over the jobs finished by the horizon.
- queueing delay = first start - arrival, averaged over jobs started by the horizon.
- ``makespan_s`` = last completion by the horizon - first arrival.
- throughput = samples per second (global batch / true iteration time, summed over jobs
  while they compute; reconfiguration downtime produces nothing), averaged exactly over
  each round interval; ``avg_throughput`` is the mean over the horizon's rounds,
  ``peak_throughput`` the largest round.
- GPU utilization of a type = GPU-seconds held by jobs / (GPUs x time), over the horizon.
- ``reconfigurations``: moves of running jobs plus resumes of preempted jobs, by the
  horizon; ``reconfig_gpu_hours_lost``: GPU-hours held during their downtime.
- ``jobs_never_placed``: submitted jobs that never ran (within the simulated span; with
  run-out: jobs that never ran at all).
- run-out only: ``avg_jct_runout_s`` over every finished job, ``makespan_runout_s`` =
  completion of the last job - first arrival.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


TIMING_KEYS = ("decision_time_median_s", "decision_time_p99_s", "decision_time_total_s", "wall_time_s")


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


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else math.nan


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else math.nan


@dataclass
class SimResult:
    summary: dict
    jobs: list                        # JobResult, one per job
    rounds: list                      # simulator.RoundRecord, one per simulated round
    instance_name: str = ""
    policy_name: str = ""
    gpus_by_type: dict = field(default_factory=dict)


def build_result(sim) -> SimResult:
    st, ex = sim.state, sim.executor
    jobs: list[JobResult] = []
    for j in sim.jobs:
        r = st.jobs[j.job_id]
        p = ex.progress(j.job_id)
        grid = str(r.alloc.grid) if r.alloc else ""
        la, rc = p.launch_lost_gpu_s, p.reconfig_lost_gpu_s
        jobs.append(JobResult(
            j.job_id, j.model, j.global_batch, j.num_iterations, j.arrival_s, j.requested_gpu_type,
            j.requested_gpus, r.status.value, r.submitted_s, r.first_start_s, r.finish_s,
            (r.finish_s - j.arrival_s) if r.finish_s is not None else None,
            (r.first_start_s - j.arrival_s) if r.first_start_s is not None else None,
            max(r.iterations_done, p.iterations_done), r.launches, r.reconfigurations, r.preemptions,
            st.attained_gpu_s_at(r, sim.end_s), la, rc, r.infeasible_drops, r.packing_failures, grid))
    summary = summarize(sim, jobs)
    return SimResult(summary, jobs, sim.rounds, getattr(sim.instance, "name", ""),
                     getattr(sim.policy, "name", type(sim.policy).__name__), dict(st.cluster.gpus_by_type))


def summarize(sim, jobs: list[JobResult]) -> dict:
    cfg = sim.cfg
    H = sim.horizon_s
    t0 = sim.t0
    I = cfg.round_interval_s
    hrounds = [r for r in sim.rounds if r.index < cfg.rounds]
    fin_h = [j for j in jobs if j.finish_s is not None and j.finish_s <= H + 1e-9]
    jct_h = [j.jct_s for j in fin_h]
    started_h = [j.queueing_delay_s for j in jobs if j.first_start_s is not None and j.first_start_s <= H + 1e-9]
    submitted = [j for j in jobs if j.submitted_s is not None]
    never = [j for j in submitted if j.first_start_s is None]
    thr = [r.throughput_samples_per_s for r in hrounds]
    dec = [r.decision_time_s for r in sim.rounds if r.decided]
    s: dict = {
        "instance": getattr(sim.instance, "name", ""),
        "policy": getattr(sim.policy, "name", type(sim.policy).__name__),
        "seed": cfg.seed,
        "round_interval_s": I,
        "horizon_rounds": cfg.rounds if cfg.rounds < cfg.max_rounds else None,   # None: no horizon
        "rounds_simulated": len(sim.rounds),
        "run_out": cfg.run_out,
        "jobs_total": len(jobs),
        "jobs_submitted": sum(1 for j in jobs if j.submitted_s is not None and j.submitted_s <= H + 1e-9),
        "jobs_finished": len(fin_h),
        "jobs_never_placed": len(never),
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
        "reconfigurations_per_job": (sum(r.reconfigurations for r in hrounds) / len(submitted)) if submitted else 0.0,
        "reconfig_gpu_hours_lost": sum(r.reconfig_lost_gpu_s for r in hrounds) / 3600.0,
        "decision_time_median_s": _pct(dec, 50),
        "decision_time_p99_s": _pct(dec, 99),
        "decision_time_total_s": float(sum(dec)),
        "rounds_decided": len(dec),
        "packing_failures": sum(r.packing_failures for r in hrounds),
        "packing_repairs": sum(r.repairs for r in hrounds),
        "displaced_by_drops": sum(r.displaced for r in hrounds),
        "infeasible_drops": sum(r.infeasible_drops for r in hrounds),
        "wall_time_s": sim.wall_s,
    }
    caps = sim.state.cluster.gpus_by_type
    span = len(hrounds) * I
    for t, n in sorted(caps.items()):
        busy = sum(r.gpu_busy_s.get(t, 0.0) for r in hrounds)
        s[f"gpu_util_{t}"] = busy / (n * span) if span > 0 else math.nan
    total = sum(caps.values())
    s["gpu_util"] = (sum(sum(r.gpu_busy_s.values()) for r in hrounds) / (total * span)) if span > 0 else math.nan
    if cfg.run_out:
        fin = [j for j in jobs if j.finish_s is not None]
        s["jobs_finished_runout"] = len(fin)
        s["jobs_unfinished_runout"] = len(jobs) - len(fin)
        s["avg_jct_runout_s"] = _mean(j.jct_s for j in fin)
        s["median_jct_runout_s"] = _pct([j.jct_s for j in fin], 50)
        s["p99_jct_runout_s"] = _pct([j.jct_s for j in fin], 99)
        s["makespan_runout_s"] = (max(j.finish_s for j in fin) - t0) if fin else math.nan
        s["avg_queueing_delay_runout_s"] = _mean(j.queueing_delay_s for j in jobs if j.queueing_delay_s is not None)
        s["stopped_by_safety"] = sim.stopped_by_safety
    return s


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_result(result, out_dir) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.json", out / "jobs.csv", out / "rounds.csv"]
    paths[0].write_text(json.dumps({k: _clean(v) for k, v in result.summary.items()}, indent=2) + "\n")
    with paths[1].open("w", newline="") as f:
        fields = list(JobResult.__dataclass_fields__)
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for j in result.jobs:
            w.writerow({k: ("" if v is None else v) for k, v in asdict(j).items()})
    types = sorted({t for r in result.rounds for t in r.gpu_busy_s})
    with paths[2].open("w", newline="") as f:
        base = [k for k in result.rounds[0].__dataclass_fields__ if k != "gpu_busy_s"] if result.rounds else []
        w = csv.writer(f)
        w.writerow(base + [f"gpu_busy_s_{t}" for t in types])
        for r in result.rounds:
            w.writerow([getattr(r, k) for k in base] + [r.gpu_busy_s.get(t, 0.0) for t in types])
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
