"""Accuracy of the estimators against measurements, and proxy-plan quality.

``against_arena``: every row of the Arena measured table (real A100/V100/A40/A10 runs,
1-16 GPUs) is predicted from architecture and catalog specs: the analytic model's best
plan over the row's pipeline depths, under the Arena artifact's runtime facts
(``config.arena_runtime``: rematerialisation, sharded optimizer update, SGD for
Wide-ResNet). The learned model is evaluated on rows it never trained on, in three
regimes (``learned_cv``): a GPU type never seen (leave-one-GPU-type-out), models never
seen, rows never seen; its correction is chosen inside each fold on the training rows
only. Rows the table marks out of memory are checked against the memory model
(``oom_boundary``: called infeasible, contradicted by the table itself, memory ranking).
``scale_oracle`` reports how much error one factor per group (GPU type, type x family,
type x shape, ...) could remove, an in-sample bound that shows where the error sits;
``learned_few_shot`` the new-GPU-type error with k rows of that type's telemetry.

``proxy_quality``: for catalog models x grids up to 16 GPUs, the proxy plan's estimated
throughput as a fraction of the grid's exhaustive best (same cost model).
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace

import numpy as np

from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from instances.grid import Shape
from instances.jobs import Job

from ..analytic import AnalyticModel
from ..choice import GROUPINGS, THROUGHPUTS, ChoicePoint, choice_quality
from ..config import EstimatorConfig, arena_runtime
from ..learned import SELECT_BY, LearnedModel, cv_folds, pick_correction, record_key, records_from_table, table_row_id
from ..planner import best_shape_result
from ..reference import load_measured

GPU_COUNTS = (1, 2, 4, 8, 16)


def _mape(errs) -> float | None:
    return float(np.mean(np.abs(errs))) if len(errs) else None


def against_arena(*, seed: int = 0, efficiency=None, few_shot: bool = False, progress=None) -> dict:
    """``progress``: called with a short line as each phase starts (the CLI prints it on stderr)."""
    say = progress or (lambda _line: None)
    rows = load_measured()
    say(f"analytic estimates of {len(rows)} measured-table rows")
    cfg = arena_runtime(None if efficiency is None else EstimatorConfig(efficiency=efficiency))
    analytic = AnalyticModel(efficiency=cfg.efficiency, memory=cfg.memory, planner=cfg.planner)
    t0 = time.perf_counter()
    by_id = {}
    oom_rows = oom_hit = 0
    missed = []
    for row in rows:
        shape = Shape(row.gpu_type, row.num_nodes, row.gpus_per_node)
        r = best_shape_result(analytic.planner, row.model, row.global_batch, shape)
        if row.iter_time_s is None:
            oom_rows += 1
            oom_hit += r is None
            continue
        if r is None:
            missed.append(f"{row.model} b{row.global_batch} {row.gpu_type} {row.num_nodes}x{row.gpus_per_node}")
            continue
        by_id[table_row_id(row)] = (row, r.iteration_time_s / row.iter_time_s - 1)
    analytic_s = time.perf_counter() - t0
    records = records_from_table(rows, analytic)
    learned, level = {}, {}
    for by in SELECT_BY:
        say(f"learned correction, cross-validated on new {by.replace('_', ' ')}s")
        learned[by] = learned_cv(records, by, seed=seed, cfg=cfg)
        level[by] = forced_cv(records, by, "type_level", seed=seed, cfg=cfg)
    out = {"rows": len(rows), "measured_rows": len(rows) - oom_rows, "predicted_rows": len(by_id),
           "called_infeasible_but_measured": missed, "oom_rows": oom_rows,
           "oom_rows_called_infeasible": oom_hit, "analytic_seconds": analytic_s, "by_gpus": {},
           "by_gpu_type": {}, "by_family": {},
           "learned_folds": {by: v["folds"] for by, v in learned.items()}}
    groups = {"by_gpus": lambda row: str(row.num_gpus), "by_gpu_type": lambda row: row.gpu_type,
              "by_family": lambda row: row.model.split("__")[0]}
    for gname, key in groups.items():
        buckets = defaultdict(lambda: {"analytic": [], **{by: [] for by in SELECT_BY}})
        for rid, (row, err) in by_id.items():
            b = buckets[key(row)]
            b["analytic"].append(err)
            for by in SELECT_BY:
                if rid in learned[by]["errors"]:
                    b[by].append(learned[by]["errors"][rid])
        for k in sorted(buckets, key=lambda x: (len(x), x)):
            b = buckets[k]
            out[gname][k] = {"rows": len(b["analytic"]), "analytic_mape": _mape(b["analytic"]),
                             "learned_mape": {by: _mape(b[by]) for by in SELECT_BY}}
    out["overall"] = {"analytic_mape": _mape([e for _, e in by_id.values()]),
                      "analytic_bias": float(np.mean([e for _, e in by_id.values()])),
                      "learned_mape": {by: _mape(list(learned[by]["errors"].values())) for by in SELECT_BY},
                      "learned_rows": {by: len(learned[by]["errors"]) for by in SELECT_BY},
                      "learned_level_mape": {by: _mape(list(level[by].values())) for by in SELECT_BY}}
    out["row_errors"] = [{"row": rid, "model": row.model, "gpu_type": row.gpu_type, "num_nodes": row.num_nodes,
                          "gpus_per_node": row.gpus_per_node, "global_batch": row.global_batch,
                          "measured_s": row.iter_time_s, "analytic": err,
                          "learned": {by: learned[by]["errors"].get(rid) for by in SELECT_BY}}
                         for rid, (row, err) in by_id.items()]
    out["scale_oracle"] = {"analytic": scale_oracle(by_id.values()),
                           "learned (new GPU type)": scale_oracle(
                               [(by_id[rid][0], e) for rid, e in learned["gpu_type"]["errors"].items()])}
    out["grid_choice"] = grid_choice(by_id, learned, level)
    if few_shot:
        say("few-shot curve of a new GPU type")
        out["few_shot"] = learned_few_shot(records, cfg=cfg)
    say("out-of-memory boundary")
    out["oom"] = oom_boundary(rows, analytic.planner)
    out["notes"] = ["analytic: efficiency constants fitted on all rows (in-sample); "
                    "--refit-analytic reports the leave-one-GPU-type-out refit",
                    "learned: the analytic estimate x a learned correction, evaluated on rows it never trained on: "
                    "gpu_type = a GPU type never seen (one fold per type), model = models never seen (5 folds), "
                    "row = rows never seen (5 folds); inside each fold the correction (none, squared or absolute "
                    "log error trees, or the group median) is chosen by cross-validation of the same kind on the "
                    "training rows only",
                    "learned-level: the analytic estimate x one factor per model family and GPU type (the "
                    "type_level correction, forced), evaluated on the same held-out folds"]
    return out


def choice_report(rows_by_id: dict, errors: dict) -> dict:
    """``choice.choice_quality`` per grouping (``choice.GROUPINGS``) and throughput (total,
    per GPU) of the estimates ``measured x (1 + errors[row id])`` of the table rows
    ``rows_by_id`` (row id -> row) that have an error."""
    pts = [ChoicePoint(row.model, row.global_batch, row.gpu_type, row.num_nodes, row.gpus_per_node,
                       row.iter_time_s, row.iter_time_s * (1 + errors[rid]))
           for rid, row in rows_by_id.items() if rid in errors]
    return {g: {t: choice_quality(pts, g, t) for t in THROUGHPUTS} for g in GROUPINGS}


def grid_choice(by_id: dict, learned: dict, level: dict | None = None) -> dict:
    """Grid-choice quality (``choice_report``) of every estimator on the measured rows: the
    analytic model (constants in-sample) and the learned model in each held-out regime,
    its correction chosen by error (``learned[by]["errors"]``) and by grid choice
    (``errors_choice``); with ``level`` (regime -> row id -> error), ``learned-level``'s."""
    rows = {rid: row for rid, (row, _) in by_id.items()}
    out = {"analytic": choice_report(rows, {rid: e for rid, (_, e) in by_id.items()})}
    for by in SELECT_BY:
        out[f"learned, new {by.replace('_', ' ')}s"] = choice_report(rows, learned[by]["errors"])
        out[f"learned, new {by.replace('_', ' ')}s, chosen by grid choice"] = choice_report(
            rows, learned[by]["errors_choice"])
        if level is not None:
            out[f"learned-level, new {by.replace('_', ' ')}s"] = choice_report(rows, level[by])
    return out


# Groupings of the scale oracle, coarse to fine: what one factor per group can absorb.
SCALE_GROUPS = (
    ("gpu_type", lambda row: (row.gpu_type,)),
    ("gpu_type x family", lambda row: (row.gpu_type, row.model.split("__")[0])),
    ("gpu_type x shape", lambda row: (row.gpu_type, row.num_nodes, row.gpus_per_node)),
    ("model x gpu_type x shape", lambda row: (row.model, row.gpu_type, row.num_nodes, row.gpus_per_node)),
)


def best_scale(ratios) -> float:
    """The factor k minimising mean |k * r - 1| over estimate/measured ratios ``r``:
    sum r_i |k - 1/r_i| is minimised by the median of 1/r_i weighted by r_i (exact)."""
    r = np.asarray(ratios, dtype=float)
    if not len(r) or np.any(r <= 0):
        raise ValueError("need positive estimate/measured ratios")
    inv = 1.0 / r
    order = np.argsort(inv)
    cum = np.cumsum(r[order])
    return float(inv[order][np.searchsorted(cum, 0.5 * cum[-1])])


def scale_oracle(pairs, groups=None) -> dict[str, dict]:
    """How much of the error one scale factor per group could remove, in-sample.

    ``pairs``: (row, estimate/measured - 1) for each predicted row. For each (name, key)
    grouping of ``groups`` (default ``SCALE_GROUPS``) every group gets its own best factor
    (``best_scale``) and the MAPE left over is reported. It is an oracle — the factors are
    chosen on the very rows they are scored on — so it is a lower bound for any
    recalibration of these estimates by such factors, not an achievable figure: with a
    factor per GPU type it bounds what a per-testbed calibration could do; per
    (model, GPU type, shape) only the batch varies inside a group, so what is left is
    roughly the table's own batch-to-batch noise."""
    out = {}
    for name, key in groups or SCALE_GROUPS:
        by_group = defaultdict(list)
        for row, err in pairs:
            by_group[key(row)].append(1.0 + err)
        errs = []
        for ratios in by_group.values():
            k = best_scale(ratios)
            errs.extend(abs(k * r - 1.0) for r in ratios)
        out[name] = {"groups": len(by_group), "mape": _mape(errs)}
    return out


def _learned_on(train, test, by: str, seed: int, cfg, correction: str = "auto") -> tuple[LearnedModel, list[float]]:
    """``LearnedModel`` (``correction``; auto: chosen by folds of kind ``by``) fitted on
    ``train`` with the analytic model of ``cfg``; its relative errors on ``test``."""
    model = LearnedModel(train_on=None, seed=seed, select_by=by, correction=correction, efficiency=cfg.efficiency,
                         memory=cfg.memory, planner=cfg.planner).fit(train)
    return model, [p / rec.measured_s - 1 for rec, p in zip(test, model.predict_records(test))]


def learned_cv(records, by: str, *, seed: int = 0, cfg=None) -> dict:
    """Errors of the learned model on rows it never trained on, with folds of kind ``by``
    (``learned.cv_folds``); inside each fold ``LearnedModel`` chooses its correction by a
    cross-validation of the same kind over that fold's training rows (nested selection).
    ``errors``: the correction chosen by the cross-validated error (the default);
    ``errors_choice``: the one chosen by the cross-validated grid choice
    (``select_metric="choice"``; the same inner cross-validation, refitted only when it
    picks another correction)."""
    cfg = cfg or arena_runtime()
    errors, errors_choice, folds = {}, {}, []
    for train_idx, test_idx in cv_folds(records, by, seed=seed):
        train = [records[i] for i in train_idx]
        test = [records[i] for i in test_idx]
        assert not {r.row_id for r in train} & {r.row_id for r in test}
        model, errs = _learned_on(train, test, by, seed, cfg)
        alt = pick_correction(model.selection, model.choice_selection, "choice")
        alt_errs = errs if alt == model.chosen else _learned_on(train, test, by, seed, cfg, correction=alt)[1]
        errors.update(zip((rec.row_id for rec in test), errs))
        errors_choice.update(zip((rec.row_id for rec in test), alt_errs))
        folds.append({"train_rows": len(train), "test_rows": len(test), "chosen": model.chosen,
                      "chosen_by_choice": alt, "selection_mape": model.selection,
                      "selection_choice": model.choice_selection,
                      "test_groups": sorted({record_key(rec, by) for rec in test}) if by != "row" else []})
    return {"errors": errors, "errors_choice": errors_choice, "folds": folds}


def forced_cv(records, by: str, correction: str, *, seed: int = 0, cfg=None) -> dict[str, float]:
    """Row id -> relative error of the learned model with ``correction`` forced (no
    selection), on rows it never trained on (folds of kind ``by``, ``learned.cv_folds``)."""
    cfg = cfg or arena_runtime()
    errors: dict[str, float] = {}
    for train_idx, test_idx in cv_folds(records, by, seed=seed):
        train = [records[i] for i in train_idx]
        test = [records[i] for i in test_idx]
        errors.update(zip((rec.row_id for rec in test), _learned_on(train, test, by, seed, cfg, correction)[1]))
    return errors


FEW_SHOTS = (0, 8, 16, 32)


def learned_few_shot(records, *, shots=FEW_SHOTS, seeds=(0, 1, 2), cfg=None,
                     correction: str = "absolute_error") -> dict:
    """A new GPU type with a little telemetry: for each GPU type and seed, a random pool of
    ``max(shots)`` of its rows is set aside and the rest of its rows are the test set (the
    same for every shot count); the learned model (fixed ``correction``, so that the curve
    shows what the telemetry buys) trains on every other type's rows plus the first ``k``
    rows of the pool. ``shots=0`` is leave-one-GPU-type-out with that correction forced on.
    Returns the MAPE on the test rows per shot count, overall and per type, next to the
    analytic model's on the same rows."""
    cfg = cfg or arena_runtime()
    shots = tuple(sorted(set(shots)))
    if not shots or shots[0] < 0:
        raise InputError(f"shot counts must be >= 0, got {shots!r}", field="shots")
    pool_size = shots[-1]
    learned = {k: [] for k in shots}
    per_type = {}
    analytic, skipped = [], []
    for gtype in sorted({r.group for r in records}):
        mine = [r for r in records if r.group == gtype]
        others = [r for r in records if r.group != gtype]
        if len(mine) <= pool_size:
            skipped.append(gtype)
            continue
        per_type[gtype] = {k: [] for k in shots}
        for seed in seeds:
            perm = np.random.default_rng(seed).permutation(len(mine))
            pool = [mine[i] for i in perm[:pool_size]]
            test = [mine[i] for i in perm[pool_size:]]
            analytic.extend(abs(r.analytic_s / r.measured_s - 1) for r in test)
            for k in shots:
                model = LearnedModel(train_on=None, correction=correction, seed=seed, efficiency=cfg.efficiency,
                                     memory=cfg.memory, planner=cfg.planner).fit(others + pool[:k])
                errs = [abs(p / r.measured_s - 1) for r, p in zip(test, model.predict_records(test))]
                learned[k].extend(errs)
                per_type[gtype][k].extend(errs)
    return {"shots": list(shots), "seeds": list(seeds), "correction": correction,
            "test_rows": len(analytic), "skipped_types": skipped, "analytic_mape": _mape(analytic),
            "learned_mape": {k: _mape(v) for k, v in learned.items()},
            "by_gpu_type": {t: {k: _mape(v) for k, v in d.items()} for t, d in per_type.items()}}


def lowest_memory_fraction(row, planner) -> float:
    """The lowest-memory plan's per-rank peak (``grids.lowest_memory_bytes``, over the
    shape's pipeline depths) of a table row, as a fraction of its GPU's memory."""
    from instances.gpus import get_gpu
    from instances.grid import Grid
    from instances.models import get_model

    from ..grids import lowest_memory_bytes
    arch, shape = get_model(row.model), Shape(row.gpu_type, row.num_nodes, row.gpus_per_node)
    n = shape.num_gpus
    peaks = [lowest_memory_bytes(arch, row.global_batch, Grid(shape, pp), planner)
             for pp in range(1, n + 1) if n % pp == 0 and pp <= len(arch.layers())]
    return min(p for p in peaks if p is not None) / get_gpu(row.gpu_type).memory_bytes


def choose_grid_margin(fractions, ran, models, usable_fraction: float) -> dict:
    """The grid memory margin from rows' lowest-memory fractions (``ran``: the row was
    measured, not out of memory): the largest fitting fraction, widened by the largest
    excess of one model's largest fitting fraction over every other model's (how much a
    model never seen has exceeded the others here), gives the limit; the margin is
    ``usable_fraction`` over that limit (a grid fits when fraction x margin <= usable)."""
    fr, ran, models = np.asarray(fractions, float), np.asarray(ran, bool), np.asarray(models)
    fit = fr[ran]
    if not len(fit):
        raise ValueError("choose_grid_margin needs at least one row that ran")
    excess = 0.0
    for m in sorted(set(models[ran])):
        mine, other = fit[models[ran] == m], fit[models[ran] != m]
        if len(other):
            excess = max(excess, mine.max() / other.max() - 1)
    limit = fit.max() * (1 + excess)
    return {"limit_fraction": float(limit), "headroom": float(excess), "margin": float(usable_fraction / limit)}


def grid_margin_cv(rows, planner, *, seeds=(0, 1, 2), fractions=None) -> dict:
    """Cross-validation of ``choose_grid_margin`` held out by model: for every fold of
    models (``cv_folds(by="model")`` per seed, and leave-one-model-out) the margin is
    chosen on the other models' rows and applied to the held-out ones; counted: held-out
    rows that ran but are called infeasible, and held-out out-of-memory rows called
    infeasible. Also the margin chosen on all rows and what it calls in-sample.
    ``fractions``: the rows' ``lowest_memory_fraction`` when the caller has them."""
    usable = planner.cfg.memory.usable_fraction
    fr = np.array(fractions if fractions is not None else [lowest_memory_fraction(r, planner) for r in rows])
    ran = np.array([r.iter_time_s is not None for r in rows])
    models = np.array([r.model for r in rows])

    def score(folds) -> dict:
        fit_bad = oom_hit = 0
        margins = []
        for train, test in folds:
            if not ran[train].any():
                continue
            ch = choose_grid_margin(fr[train], ran[train], models[train], usable)
            margins.append(ch["margin"])
            out = fr[test] * ch["margin"] > usable
            fit_bad += int((out & ran[test]).sum())
            oom_hit += int((out & ~ran[test]).sum())
        return {"fitting_rows_called_infeasible": fit_bad, "oom_rows_called_infeasible": oom_hit,
                "margins": [round(m, 3) for m in margins]}

    per_seed = {str(seed): score([(np.array(a), np.array(b)) for a, b in
                                  cv_folds(rows, "model", seed=seed, key=lambda r, by: r.model)])
                for seed in seeds}
    names = sorted(set(models))
    lomo = score([(np.flatnonzero(models != m), np.flatnonzero(models == m)) for m in names])
    full = choose_grid_margin(fr, ran, models, usable)
    out = fr * full["margin"] > usable
    return {"rows": len(rows), "measured_rows": int(ran.sum()), "oom_rows": int((~ran).sum()),
            "five_model_folds": per_seed, "leave_one_model_out": lomo, "all_rows": full,
            "all_rows_fitting_called_infeasible": int((out & ran).sum()),
            "all_rows_oom_called_infeasible": int((out & ~ran).sum()),
            "margin_in_use": planner.cfg.memory.grid_margin}


def oom_boundary(rows, planner) -> dict:
    """How the memory model sees the table's out-of-memory rows.

    An OOM row is *contradicted by the table* when the same model ran at the same shape
    with a larger global batch (which needs at least as much memory under any plan): no
    memory model that grows with the batch can call such a row infeasible, so it is a
    failure of the authors' plan search or runtime, not a memory limit. For every row the
    lowest-memory plan over the shape's pipeline depths (``lowest_memory_fraction``) is
    taken as a fraction of GPU memory; ``ranking_auc`` is the probability that an
    uncontradicted OOM row needs more of its GPU's memory than a measured row (1: the
    model orders them perfectly; 0.5: no better than chance), a threshold-free check of
    the memory model that does not depend on the usable-memory fraction."""
    ran = {}
    for r in rows:
        if r.iter_time_s is not None:
            ran.setdefault((r.model, r.gpu_type, r.num_nodes, r.gpus_per_node), []).append(r.global_batch)

    def name(r) -> str:
        return f"{r.model} b{r.global_batch} {r.gpu_type} {r.num_nodes}x{r.gpus_per_node}"

    fractions = [lowest_memory_fraction(r, planner) for r in rows]
    measured_frac = [f for r, f in zip(rows, fractions) if r.iter_time_s is not None]
    oom = []
    for r, f in zip(rows, fractions):
        if r.iter_time_s is not None:
            continue
        larger = sorted(b for b in ran.get((r.model, r.gpu_type, r.num_nodes, r.gpus_per_node), ())
                        if b > r.global_batch)
        oom.append({"row": name(r), "lowest_memory_fraction": f, "contradicted_by_batches": larger})
    clean = [o["lowest_memory_fraction"] for o in oom if not o["contradicted_by_batches"]]
    pairs = [(a > m) + 0.5 * (a == m) for a in clean for m in measured_frac]
    return {"rows": oom, "contradicted_by_table": sum(bool(o["contradicted_by_batches"]) for o in oom),
            "uncontradicted": len(clean),
            "ranking_auc": float(np.mean(pairs)) if pairs else None,
            "measured_max_lowest_fraction": max(measured_frac) if measured_frac else None,
            "measured_rows_above_lowest_oom": (sum(m >= min(clean) for m in measured_frac) if clean else None),
            "grid_margin_cv": grid_margin_cv(rows, planner, fractions=fractions)}


def _row_key(row, by: str) -> str:
    return row.gpu_type if by == "gpu_type" else row.model


def analytic_refit(*, efficiency=None, max_evals: int = 120, regimes=("gpu_type",), gpu_types=None,
                   in_sample: bool = True, seed: int = 0, starts: int = 2) -> dict:
    """The analytic model with its global efficiency constants refitted
    (``calibrate.fit_efficiency``, every fit from ``calibrate.NEUTRAL_START``): in-sample on
    all measured rows, and out of sample for each of ``regimes`` (``learned.SELECT_BY``:
    ``gpu_type`` fits on three types' rows and tests on the fourth's; ``model`` / ``row``
    on 4 of 5 folds of models / rows), so that the in-sample effect of the constants is
    visible. In every fold the learned model is then trained on top of that fold's
    constants on the fold's training rows only (its correction chosen by folds of the same
    kind): the fully out-of-sample chain. Every fit is a multi-start from data-independent
    points (``calibrate.fit_efficiency`` with ``starts``). Slow: minutes per fold;
    ``gpu_types`` limits the held-out types of the ``gpu_type`` regime. Each regime also
    reports the grid choice (``choice_report``) of its out-of-fold estimates."""
    from .calibrate import fit_efficiency, neutral_start, ratios
    rows = [r for r in load_measured() if r.iter_time_s is not None]
    rows_by_id = {table_row_id(r): r for r in rows}
    base = arena_runtime(None if efficiency is None else EstimatorConfig(efficiency=efficiency))
    base = replace(base, efficiency=neutral_start(base.efficiency))     # no start fitted on test rows

    def row_errors(eff, test) -> dict:
        return {table_row_id(r): q - 1 for r, q in zip(test, ratios(replace(base, efficiency=eff), test))
                if q is not None}

    def errors(eff, test):
        return list(row_errors(eff, test).values())

    t0 = time.perf_counter()
    in_sample_err = errors(fit_efficiency(rows, base, max_evals=max_evals, starts=starts), rows) if in_sample else []
    out = {"in_sample_mape": _mape(in_sample_err), "in_sample_rows": len(in_sample_err), "max_evals": max_evals,
           "starts": starts, "regimes": {}}
    for by in regimes:
        errs, learned_errs, folds = [], [], []
        by_row, by_row_learned = {}, {}
        for train_idx, test_idx in cv_folds(rows, by, seed=seed, key=_row_key):
            test = [rows[i] for i in test_idx]
            if by == "gpu_type" and gpu_types is not None and test[0].gpu_type not in gpu_types:
                continue
            train = [rows[i] for i in train_idx]
            eff = fit_efficiency(train, base, max_evals=max_evals, starts=starts)
            fold_errors = row_errors(eff, test)
            by_row.update(fold_errors)
            e = list(fold_errors.values())
            records = records_from_table(rows, AnalyticModel(efficiency=eff, memory=base.memory,
                                                             planner=base.planner))
            held = {table_row_id(r) for r in test}
            held_recs = [r for r in records if r.row_id in held]
            lm, le = _learned_on([r for r in records if r.row_id not in held], held_recs, by, seed,
                                 replace(base, efficiency=eff))
            by_row_learned.update(zip((r.row_id for r in held_recs), le))
            errs += e
            learned_errs += le
            folds.append({"held_out": test[0].gpu_type if by == "gpu_type" else f"{len(test)} rows",
                          "train_rows": len(train), "test_rows": len(e), "mape": _mape(e),
                          "bias": float(np.mean(e)) if e else None, "learned_mape": _mape(le),
                          "learned_correction": lm.chosen})
        out["regimes"][by] = {"mape": _mape(errs), "learned_mape": _mape(learned_errs), "rows": len(errs),
                              "folds": folds,
                              "grid_choice": {"analytic, constants refitted": choice_report(rows_by_id, by_row),
                                              "+ learned correction": choice_report(rows_by_id, by_row_learned)}}
    out["seconds"] = time.perf_counter() - t0
    return out


def proxy_quality(*, models=None, max_gpus: int = 16, batches=(256,), max_exhaustive_splits: int = 200) -> dict:
    """Proxy throughput / exhaustive-best throughput over models x grids (catalog GPU types
    of the Arena cluster, node sizes as there)."""
    from ..grids import candidate_grids
    cfg = EstimatorConfig()
    cfg = replace(cfg, planner=replace(cfg.planner, max_exhaustive_splits=max_exhaustive_splits))
    model = AnalyticModel(planner=cfg.planner)
    planner = model.planner
    cluster = ClusterSpec((NodeGroup("a100", 4, 4), NodeGroup("v100", 1, 16), NodeGroup("a40", 8, 2),
                           NodeGroup("a10", 8, 2)), "arena-shapes")
    if models is None:
        models = sorted({r.model for r in load_measured()})
    ratios, worst, t0 = [], [], time.perf_counter()
    n_plans = 0
    for name in models:
        for b in batches:
            job = Job("q", name, b, 1, 0.0)
            for grid in candidate_grids(job, cluster, max_gpus=max_gpus, planner=planner):
                prox = planner.proxy(job.arch, b, grid)
                best = planner.exhaustive(job.arch, b, grid)
                if best is None or prox is None or not prox.feasible:
                    if best is not None:
                        ratios.append(0.0)
                        worst.append((0.0, name, b, str(grid)))
                    continue
                n_plans += best.evaluated
                q = best.iteration_time_s / prox.iteration_time_s
                ratios.append(q)
                worst.append((q, name, b, str(grid)))
    worst.sort()
    return {"grids": len(ratios), "mean_fraction_of_best": float(np.mean(ratios)) if ratios else None,
            # against the better of the two plans (the bounded exhaustive search can miss what the proxy finds)
            "mean_fraction_of_best_known": float(np.mean(np.minimum(ratios, 1.0))) if ratios else None,
            "grids_proxy_beats_search": int(sum(q > 1.0 + 1e-9 for q in ratios)),
            "min_fraction_of_best": float(min(ratios)) if ratios else None,
            "fraction_within_5pct": float(np.mean([q >= 0.95 for q in ratios])) if ratios else None,
            "plans_evaluated": n_plans, "seconds": time.perf_counter() - t0,
            "worst": [{"fraction": q, "model": m, "batch": b, "grid": g} for q, m, b, g in worst[:5]]}


def dp_memory_check(*, gpu_type: str = "a100-40gb") -> dict:
    """Feasibility under pure data parallelism against Arena's DP memory table
    (dp_mem.json; -1 = out of memory). For each (model, batch, n GPUs) the dp-only proxy
    plan (pp = tp = 1, the fewest micro-batches that fit) is computed on ``gpu_type`` (the
    table does not name its GPU; its largest fitting entries are just under 40 GB, as on
    an A100-40GB). Reported: agreement on fits / does not fit. The table's GB figures are
    not compared: its micro-batch count is not recorded."""
    from instances.grid import Grid
    from instances.models import get_model

    from ..reference import load_dp_memory
    cfg = arena_runtime()
    planner = AnalyticModel(dp_only=True, efficiency=cfg.efficiency, memory=cfg.memory, planner=cfg.planner).planner
    fit_rows = fit_hit = oom = oom_hit = 0
    for r in load_dp_memory():
        arch = get_model(r.model)
        res = planner.proxy(arch, r.global_batch, Grid(Shape(gpu_type, 1, r.num_gpus), 1), dp_only=True)
        ok = res is not None and res.feasible
        if r.memory_bytes is None:
            oom += 1
            oom_hit += not ok
        else:
            fit_rows += 1
            fit_hit += ok
    return {"fit_rows": fit_rows, "fit_rows_called_feasible": fit_hit, "oom_rows": oom,
            "oom_rows_called_infeasible": oom_hit, "gpu_type": gpu_type}
