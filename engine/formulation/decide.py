"""One round of an optimizing policy: context -> round data -> model -> solver -> decisions.

Shared by ``arena`` and the optimizing baselines (``sia``, ``gavel``): they differ in
their estimator (full 3D plans vs data parallel only), their candidate grids and their
objective. Candidate grids are cached per (model, global batch): they depend on the
job only through those. The hint for the solver is what every job runs now (the
previous round's decision as carried out).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from instances.grid import Grid

from ..context import Allocation, Decisions, RoundContext
from .build import build_model
from .round_data import build_round_data


MAX_PLACEMENT_REPAIRS = 4


def solve_safely(backend, model, time_limit_s: float, hint, rel_gap: float):
    """The backend's solution; any exception becomes a greedy decision (status "error")."""
    from ..solvers.base import BackendUnavailable
    from ..solvers.greedy import greedy_solution
    try:
        return backend.solve(model, time_limit_s, hint=hint, rel_gap=rel_gap)
    except BackendUnavailable:
        raise
    except Exception as e:          # a round never crashes: decide greedily and say why
        return greedy_solution(model, backend=getattr(backend, "name", "?"), status="error",
                               message=f"{type(e).__name__}: {e}; greedy decision")


def parse_job_list(value) -> frozenset[str]:
    if value is None or value == "":
        return frozenset()
    if isinstance(value, str):
        return frozenset(p.strip() for p in value.split(",") if p.strip())
    return frozenset(str(v) for v in value)


@dataclass
class MilpDecider:
    objective: Any
    backend: Any
    time_limit_s: float = 10.0
    rel_gap: float = 0.01
    max_gpus: int = 16
    dp_only: bool = False
    pinned: frozenset = frozenset()
    dump_rounds_dir: str | None = None
    grid_filter: Callable | None = None
    check_placement: bool = True
    _placers: dict = field(default_factory=dict, repr=False)
    _grid_cache: dict = field(default_factory=dict, repr=False)
    _est_cache: dict = field(default_factory=dict, repr=False)
    _est_owner: Any = field(default=None, repr=False)

    def _grids_fn(self):
        from estimators.grids import candidate_grids
        cache = self._grid_cache

        def fn(job, cluster, max_gpus):
            key = (job.model, job.global_batch, id(cluster), max_gpus)
            g = cache.get(key)
            if g is None:
                g = candidate_grids(job, cluster, max_gpus=max_gpus, dp_only=self.dp_only)
                cache[key] = g
            return g
        return fn

    def _filter(self):
        user = self.grid_filter

        def keep(view, grid: Grid) -> bool:
            if grid.shape in view.known_infeasible_shapes:
                return False
            return user is None or user(view, grid)
        return keep

    def decide(self, ctx: RoundContext, perf) -> Decisions:
        t0 = time.perf_counter()
        if self._est_owner is not perf:        # estimates cached per performance model
            self._est_cache, self._est_owner = {}, perf
        data = build_round_data(ctx, perf, grids_fn=self._grids_fn(), max_gpus=self.max_gpus,
                                grid_filter=self._filter(), estimate_cache=self._est_cache)
        t1 = time.perf_counter()
        model = build_model(data, self.objective, self.pinned)
        t2 = time.perf_counter()
        hint = np.zeros(model.n_x)
        hint[data.current_col[data.current_col >= 0]] = 1.0
        sol = solve_safely(self.backend, model, self.time_limit_s, hint, self.rel_gap)
        t3 = time.perf_counter()
        chosen = {int(data.col_job[k]): int(k) for k in sol.selected(model.n_x).tolist()}
        placements, repairs, dropped = {}, 0, []
        if self.check_placement:
            chosen, placements, repairs, dropped = self._place(ctx, data, model, chosen)
        grids, plans = {}, {}
        for j, k in chosen.items():
            jid = data.job_ids[j]
            grids[jid] = data.grids[k]
            if data.plans[k] is not None:
                plans[jid] = data.plans[k]
        if self.dump_rounds_dir:
            from ..solvers.pulp_backend import export_model
            d = Path(self.dump_rounds_dir)
            d.mkdir(parents=True, exist_ok=True)
            export_model(model, d / f"round_{ctx.round_index:05d}.mps", "mps")
            export_model(model, d / f"round_{ctx.round_index:05d}.lp", "lp")
        info = {**sol.stats(), "placement_repairs": repairs, "placement_dropped": dropped, "jobs": data.n_jobs, "columns": data.n_cols, "rows": model.n_rows,
                "unschedulable": list(data.unschedulable), "estimate_time_s": t1 - t0,
                "model_build_time_s": t2 - t1, "solve_wall_s": t3 - t2, "decide_time_s": time.perf_counter() - t0}
        return Decisions(grids=grids, plans=plans, placements=placements, info=info)

    def _place(self, ctx, data, model, chosen: dict[int, int]):
        return place_with_repair(self._placers, ctx, data, model.c[: model.n_x], chosen)


def place_with_repair(placers: dict, ctx, data, col_value, chosen: dict[int, int]):
    """Place the chosen grids with the engine's placement; a job whose grid does not
    fit (the model's node-shape rows do not see which GPUs running jobs keep, nor that
    a multi-node job needs distinct nodes) moves to its best smaller column, else
    waits. Returns (chosen, pinned GPUs, repairs, dropped job ids)."""
    from ..placement import Placer
    key = id(ctx.cluster)
    placer = placers.get(key)
    if placer is None:
        placer = placers[key] = Placer(ctx.cluster)
    current = {v.job_id: v.current for v in ctx.jobs if v.current is not None}
    index = {jid: j for j, jid in enumerate(data.job_ids)}
    chosen = dict(chosen)
    repairs, dropped = 0, []
    c = col_value
    for _ in range(MAX_PLACEMENT_REPAIRS):
        requests = {data.job_ids[j]: data.grids[k] for j, k in chosen.items()}
        res = placer.place(requests, current)
        if not res.failed:
            break
        for jid in res.failed:
            j = index[jid]
            k = chosen.pop(j)
            lo, hi = np.searchsorted(data.col_job, [j, j + 1])
            alts = [a for a in range(lo, hi) if data.col_gpus[a] < data.col_gpus[k]]
            if alts:
                chosen[j] = max(alts, key=lambda a: c[a])
                repairs += 1
            else:
                dropped.append(jid)
    else:
        requests = {data.job_ids[j]: data.grids[k] for j, k in chosen.items()}
        res = placer.place(requests, current)
        for jid in res.failed:
            chosen.pop(index[jid], None)
            dropped.append(jid)
        res = placer.place({data.job_ids[j]: data.grids[k] for j, k in chosen.items()}, current)
    placements = {jid: a.gpus for jid, a in res.allocations.items()}
    return chosen, placements, repairs, dropped


def nominal_allocation(grid: Grid) -> Allocation:
    """An allocation of ``grid`` on not-yet-chosen GPUs (node id -1): the reconfiguration
    cost model prices by grid, the GPUs are chosen by placement after the decision."""
    return Allocation(grid, tuple((-1, i) for i in range(grid.num_gpus)))


# Knobs every optimizing policy accepts (besides its objective keys w_<term>, <term>.<opt>).
DECIDER_KEYS = ("backend", "time_limit_s", "rel_gap", "max_gpus", "threads", "seed", "pinned_jobs",
                "dump_rounds_dir")


def make_decider(policy: str, config: dict, default_weights: dict, *, default_backend: str = "auto",
                 dp_only: bool = False, grid_filter=None, extra_keys: tuple = ()) -> tuple[MilpDecider, dict]:
    """Validate a policy's keyword config; returns the decider and the policy's own extra keys."""
    from instances.errors import InputError

    from ..objectives import parse_objective, split_objective_config
    from ..solvers import SolverOptions, make_backend

    obj_cfg, rest = split_objective_config(config)
    unknown = sorted(set(rest) - set(DECIDER_KEYS) - set(extra_keys))
    if unknown:
        raise InputError(f"policy {policy!r}: unknown option(s) {unknown}; known: "
                         f"{sorted(DECIDER_KEYS + tuple(extra_keys))} and w_<term>, <term>.<option>",
                         field=unknown[0])

    def num(key, default, cast, lo):
        v = rest.get(key, default)
        try:
            v = cast(v)
        except (TypeError, ValueError):
            raise InputError(f"policy {policy!r}: {key} must be a number, got {v!r}", field=key) from None
        if not v >= lo:
            raise InputError(f"policy {policy!r}: {key} must be >= {lo}, got {v!r}", field=key)
        return v

    options = SolverOptions(threads=num("threads", 1, int, 1), seed=num("seed", 0, int, 0))
    decider = MilpDecider(
        objective=parse_objective(obj_cfg, default_weights),
        backend=make_backend(str(rest.get("backend", default_backend)), options),
        time_limit_s=num("time_limit_s", 10.0, float, 0.01), rel_gap=num("rel_gap", 0.01, float, 0.0),
        max_gpus=num("max_gpus", 16, int, 1), dp_only=dp_only,
        pinned=parse_job_list(rest.get("pinned_jobs")), dump_rounds_dir=rest.get("dump_rounds_dir") or None,
        grid_filter=grid_filter)
    return decider, {k: rest[k] for k in extra_keys if k in rest}


def dp_only_performance_model(perf, cache: dict):
    """The data-parallel-only twin of ``perf`` (same estimator kind, ``dp_only=True``),
    built once: what the baselines decide with, as the published comparisons did."""
    from estimators import kind_names, make_performance_model
    kind = str(getattr(perf, "name", "table")).split("-")[0]
    if kind not in kind_names():
        kind = "table"
    model = cache.get(kind)
    if model is None:
        model = cache[kind] = make_performance_model(kind, dp_only=True)
    return model
