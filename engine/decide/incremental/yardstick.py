"""The incremental search's quality yardstick: the full per-round MILP.

Times are wall-clock (``time.perf_counter``) and CPU (``time.process_time``; both
sides run in one thread, so CPU time is the fairer figure on a shared machine).

A sequence of synthetic rounds (``engine.decide.formulation.synthetic``) in which each round
starts from the allocation decided in the previous one (jobs leave and arrive between
rounds). Round 0 starts from an empty cluster and is decided by the full MILP (the
state the incremental search takes over); rounds 1..R are each decided both ways on
the same round data:

- the full MILP (``build_model`` + the backend, hinted with the current allocation,
  warm prices carried over from round to round, as in the policy);
- the incremental search (candidates + restricted model + search; ``search_round``),
  its compiled kernels loaded before the first round (``kernel.warm_up``: a one-time
  cost per process, reported on stderr, not a per-round one).

Both decisions are evaluated with the full model's ``c @ x`` (the constant offset, the
same for both, excluded) and checked against every row of it. The next round starts
from the incremental decision (``follow="incremental"``, what the search would face in
service) or from the MILP's (``follow="milp"``).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import numpy as np

from ..formulation import build_model, synthetic_round_data
from ..formulation.synthetic import local_columns
from ..objectives import Objective
from ..solvers import SolverOptions, make_backend
from .round import IncrementalConfig, search_round

FOLLOW = ("incremental", "milp")


def _selected_full(model, values, cols=None) -> np.ndarray:
    sel = model.selected(values)
    return sel if cols is None else cols[sel]


def yardstick(gpus: int, jobs: int, rounds: int, objective: Objective, config: IncrementalConfig, *,
              backend: str = "auto", time_limit_s: float = 30.0, rel_gap: float = 0.01, seed: int = 0,
              reconfig_s_per_gpu: float, reconfig_cap_s: float, follow: str = "incremental",
              log: Callable[[str], None] | None = None) -> list[dict]:
    """One row per round 1..``rounds`` (see module doc)."""
    if follow not in FOLLOW:
        raise ValueError(f"follow must be one of {FOLLOW}, got {follow!r}")
    solver = make_backend(backend, SolverOptions(seed=seed))
    from . import kernel
    kernel.warm_up()                     # once per process, not a per-round cost
    current: dict[str, int] = {}
    rows = []
    for r in range(rounds + 1):
        data = synthetic_round_data(gpus, jobs, seed, round_index=r, current=current,
                                    reconfig_s_per_gpu=reconfig_s_per_gpu, reconfig_cap_s=reconfig_cap_s)
        t0, c0 = time.perf_counter(), time.process_time()
        full = build_model(data, objective)
        hint = np.zeros(full.n_x)
        hint[data.current_col[data.current_col >= 0]] = 1.0
        sol = solver.solve(full, time_limit_s, hint=hint, rel_gap=rel_gap)
        t_milp, c_milp = time.perf_counter() - t0, time.process_time() - c0
        milp_cols = _selected_full(full, sol.values)
        if r == 0:
            current = local_columns(data, milp_cols)
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        # a fresh copy: the incremental side computes the round's derived arrays itself,
        # as a policy's single search does, rather than reading the MILP build's
        model, cols, inc = search_round(replace(data), objective, config)
        t_inc, c_inc = time.perf_counter() - t0, time.process_time() - c0
        inc_cols = _selected_full(model, inc.values, cols)
        x = np.zeros(full.n_x)
        x[inc_cols] = 1.0
        viol = full.violation(x)
        if viol > 1e-6:
            raise AssertionError(f"round {r}: the incremental decision violates the full model by {viol}")
        stay = np.zeros(full.n_x)
        stay[data.current_col[data.current_col >= 0]] = 1.0
        c = full.c[: full.n_x]
        v_milp = float(c @ sol.values[: full.n_x])
        v_inc = float(c @ x)
        row = {"round": r, "jobs": data.n_jobs, "columns": data.n_cols, "candidates": int(model.n_x),
               "running_at_start": int(np.sum(data.current_col >= 0)),
               "milp_value": v_milp, "incremental_value": v_inc, "stay_value": float(c @ stay),
               "ratio": v_inc / v_milp if v_milp else float("nan"),
               "stay_ratio": float(c @ stay) / v_milp if v_milp else float("nan"),
               "milp_bound": float(sol.bound), "milp_status": sol.status,
               "milp_time_s": t_milp, "incremental_time_s": t_inc,
               "speedup": t_milp / t_inc if t_inc > 0 else float("inf"),
               "milp_cpu_s": c_milp, "incremental_cpu_s": c_inc,
               "incremental_candidates_s": inc.extra["candidates_s"], "incremental_model_s": inc.extra["model_s"],
               "incremental_search_s": inc.solve_time_s, "incremental_status": inc.status,
               **{f"incremental_{k}_s": inc.extra[f"{k}_s"] for k in ("setup", "expand", "balance")},
               **{k: inc.extra[k] for k in ("moved_jobs", "moved_gpus", "expand_moves", "balance_moves",
                                            "repair_stops")}}
        rows.append(row)
        if log:
            log(f"  round {r}: incremental {row['ratio']:.4f} of the MILP (stay {row['stay_ratio']:.4f}), "
                f"{t_inc:.4f} s vs {t_milp:.4f} s ({row['speedup']:.1f}x), moved {row['moved_jobs']} jobs")
        current = local_columns(data, inc_cols if follow == "incremental" else milp_cols)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Worst and median ratio, median times and the ratio of the median times."""
    if not rows:
        return {}
    ratio = np.array([r["ratio"] for r in rows])
    tm = np.array([r["milp_time_s"] for r in rows])
    ti = np.array([r["incremental_time_s"] for r in rows])
    return {"rounds": len(rows), "min_ratio": float(ratio.min()), "median_ratio": float(np.median(ratio)),
            "mean_ratio": float(ratio.mean()), "median_stay_ratio": float(np.median([r["stay_ratio"] for r in rows])),
            "median_milp_time_s": float(np.median(tm)), "median_incremental_time_s": float(np.median(ti)),
            "median_speedup": float(np.median(tm / ti)), "min_speedup": float(np.min(tm / ti)),
            **{f"median_incremental_{k}_s": float(np.median([r[f"incremental_{k}_s"] for r in rows]))
               for k in ("candidates", "model", "search", "setup", "expand", "balance")},
            "median_cpu_speedup": float(np.median([r["milp_cpu_s"] / max(r["incremental_cpu_s"], 1e-9)
                                                   for r in rows])),
            "moved_jobs_mean": float(np.mean([r["moved_jobs"] for r in rows]))}
