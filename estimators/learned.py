"""Learned, load-aware correction of the analytic model.

Target: ``log(measured iteration time / analytic estimate)`` of the same plan (for the
Arena table: the analytic best plan over the shape's pipeline depths, since the table
holds the authors' best plan). Regressor: scikit-learn gradient boosting (or a group
median, below). Features:

- composition: log analytic time and its shares (compute, TP comm, pipeline p2p,
  bubble, exposed DP all-reduce, optimizer), memory utilisation;
- plan: pp, dp, tp, micro-batches, log micro-batch size, GPUs, nodes, GPUs per node;
- GPU specs (catalog): log peak FLOP/s of the model's dtype, log memory and link
  bandwidths, memory size, PCIe flag;
- model: family, log parameters, bytes per element;
- ``link_load``: other jobs' traffic through the same node or switch, as a fraction of
  link capacity (callers supply it; 0 when unknown).

Model selection: the correction is one of ``CORRECTIONS`` — ``none`` (the analytic
estimate as it is), boosted trees with a squared or an absolute log error, or ``group``
(the median log error of the training rows in the row's most specific group of family,
GPU type and shape: ``group_correction.py``) — chosen, when ``correction="auto"``,
among ``AUTO_CANDIDATES`` by cross-validation over the training records only, with
folds that hold out what the deployment will meet unseen (``select_by``): ``row`` (new plans of
jobs and GPU types the cluster already ran; 5 folds), ``model`` (new models; 5 folds of
models) or ``gpu_type`` (a new GPU type; one fold per type). What the selection
optimises (``select_metric``): ``error`` (default) the cross-validated MAPE, or
``choice`` the cross-validated grid choice (``choice.choice_score``: the true per-GPU
throughput of the shape the estimates rank best, over the best) — for a scheduler that
uses the estimate to pick grids, when a correction that lowers the error ranks shapes
worse. The accuracy report nests this selection inside each outer fold, so no test row
ever influences the choice. ``type_level`` (one factor per family and GPU type, the
``group`` median at that level only) is never chosen by ``auto``: it is for ranking
grids (the kind ``learned-level``), not for the lowest error.

Trained from the Arena measured table plus, when a ``profile_store`` is given, the
store's measured runs (launcher telemetry); updated
online with ``update(records)`` (records accumulate; the regressor is refitted); saved
and loaded with a versioned joblib artifact. ``cv_folds`` yields the train/test splits of
the selection and of the accuracy report (their rows never overlap).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from instances.errors import InputError
from instances.gpus import get_gpu
from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.models import get_model
from instances.plan import Plan

from .analytic import AnalyticModel
from .base import Estimate
from .planner import PlanResult, best_shape_result

ARTIFACT_VERSION = 2
CORRECTIONS = ("none", "squared_error", "absolute_error", "group", "type_level")   # "none": the analytic as it is
AUTO_CANDIDATES = CORRECTIONS[:4]        # what correction="auto" chooses among (not type_level: for ranking only)
SELECT_BY = ("row", "model", "gpu_type")
SELECT_METRICS = ("error", "choice")      # what the auto selection optimises: MAPE, or the grid choice
FAMILIES = ("gpt", "moe", "wide_resnet", "llama")
FEATURES = ("log_analytic_s", "share_compute", "share_tp", "share_p2p", "share_bubble", "share_dp",
            "share_opt", "mem_util", "pp", "dp", "tp", "microbatches", "log_micro_batch", "num_gpus",
            "num_nodes", "gpus_per_node", "log_peak_flops", "log_mem_bw", "log_intra_bw", "log_inter_bw",
            "gpu_mem_gib", "pcie", "log_params", "dtype_bytes", "link_load") + tuple(f"fam_{f}" for f in FAMILIES)


@dataclass(frozen=True)
class TrainingRecord:
    row_id: str                 # unique per measured row (never in both train and test)
    group: str                  # e.g. the GPU type, for leave-one-group-out
    features: tuple[float, ...]
    analytic_s: float
    measured_s: float

    @property
    def target(self) -> float:
        return math.log(self.measured_s / self.analytic_s)


def features(model: str, gpu_type: str, num_nodes: int, gpus_per_node: int, r: PlanResult,
             link_load: float = 0.0, eff=None) -> tuple[float, ...]:
    """Feature vector of one planned row; ``eff`` (EfficiencyConfig) decides which compute
    peak the model's dtype gets (TF32 or not), as in the analytic model."""
    arch, gpu = get_model(model), get_gpu(gpu_type)
    peak = eff.compute_peak_flops(gpu, arch.dtype) if eff is not None else gpu.peak_flops(arch.dtype)
    bd, p = r.breakdown, r.plan
    sh = bd.shares()
    fam = arch.base_family
    return (math.log(bd.iteration_time_s), sh["compute"], sh["tp_comm"], sh["p2p"], sh["bubble"],
            sh["dp_exposed"], sh["optimizer"], r.memory.peak_bytes / gpu.memory_bytes, p.pp, p.dp, p.tp,
            p.microbatches, math.log(bd.micro_batch), num_nodes * gpus_per_node, num_nodes, gpus_per_node,
            math.log(peak), math.log(gpu.memory_bw_bytes_per_s),
            math.log(gpu.intra_node_bw_bytes_per_s), math.log(gpu.inter_node_bw_bytes_per_s),
            gpu.memory_bytes / 2**30, float(gpu.interconnect == "pcie"), math.log(arch.param_count),
            arch.dtype_bytes, float(link_load)) + tuple(float(fam == f) for f in FAMILIES)


def table_row_id(row) -> str:
    """The record id of an Arena-table row (``arena:<model>:<batch>:<type>:<nodes>x<gpus>``)."""
    return f"arena:{row.model}:{row.global_batch}:{row.gpu_type}:{row.num_nodes}x{row.gpus_per_node}"


def records_from_table(rows, analytic: AnalyticModel) -> list[TrainingRecord]:
    """One record per measured (non-OOM) table row that the analytic model can plan."""
    out = []
    for i, row in enumerate(rows):
        if row.iter_time_s is None:
            continue
        r = best_shape_result(analytic.planner, row.model, row.global_batch,
                              Shape(row.gpu_type, row.num_nodes, row.gpus_per_node))
        if r is None:
            continue
        out.append(TrainingRecord(table_row_id(row), row.gpu_type, features(row.model, row.gpu_type, row.num_nodes,
                                                              row.gpus_per_node, r,
                                                              eff=analytic.cfg.efficiency),
                                  r.iteration_time_s, row.iter_time_s))
    return out


def records_from_runs(runs, analytic: AnalyticModel) -> list[TrainingRecord]:
    """Records from the profile store's measured runs (launcher telemetry): the run's own
    plan is composed analytically (stage split: the balanced one)."""
    out = []
    for k, run in enumerate(runs):
        try:
            arch = get_model(run["model"])
            gpu_type = run.get("gpu_type") or run.get("device")
            gpu = get_gpu(gpu_type)
            pp, dp, tp = int(run["pp"]), int(run["dp"]), int(run["tp"])
            gpn = int(run.get("gpus_per_node") or dp * tp * pp)
            nodes = int(run.get("num_nodes") or 1)
            split = analytic.planner.split(arch, gpu, pp)
            plan = Plan(pp, dp, tp, split, int(run.get("microbatches", 1)), run.get("schedule", "1f1b"))
            batch = int(run.get("global_batch") or dp)
            load = float(run.get("link_load", 0.0))
            r = analytic.planner.evaluate(arch, plan, global_batch=batch, gpu=gpu, gpus_per_node=gpn,
                                          link_load=load)
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"measured run {k}: {e}", field="measured_runs") from None
        t = float(run["iteration_time_s"])
        if not t > 0:
            continue
        rid = f"run:{k}:{run.get('timestamp', '')}"
        feats = features(arch.name, gpu.name, nodes, gpn, r, load, analytic.cfg.efficiency)
        out.append(TrainingRecord(rid, gpu.name, feats,
                                  r.iteration_time_s, t))
    return out


@lru_cache(maxsize=4)
def _arena_records(cfg) -> tuple[TrainingRecord, ...]:
    """Training records from the Arena measured table under one estimator config (cached
    per process: every learned model built with that config trains on the same rows)."""
    from .reference import load_measured
    return tuple(records_from_table(load_measured(), AnalyticModel(efficiency=cfg.efficiency, memory=cfg.memory,
                                                                   planner=cfg.planner)))


def record_key(rec: TrainingRecord, by: str) -> str:
    """What a ``cv_folds`` fold of kind ``by`` groups a training record by."""
    return rec.group if by == "gpu_type" else record_model(rec)


def cv_folds(records: list, by: str, *, n_splits: int = 5, seed: int = 0, key=record_key):
    """Yield (train, test) index lists over ``records`` whose test side is unseen in the
    sense of ``by`` (``SELECT_BY``): ``gpu_type`` one fold per GPU type; ``model``
    ``n_splits`` folds of whole models; ``row`` ``n_splits`` shuffled folds of rows.
    ``key(record, by)`` names a record's GPU type or model (default: ``record_key`` for
    ``TrainingRecord``s); the same ``seed`` gives the same folds for the same keys."""
    if by not in SELECT_BY:
        raise InputError(f"unknown fold kind {by!r}; known: {', '.join(SELECT_BY)}", field="select_by")
    rng = np.random.default_rng(seed)
    if by == "row":
        fold = rng.permutation(len(records)) % n_splits
    else:
        key = [key(r, by) for r in records]
        groups = sorted(set(key))
        if by == "model":
            order = rng.permutation(len(groups))
            gfold = {groups[i]: k % n_splits for k, i in enumerate(order)}
        else:
            gfold = {g: k for k, g in enumerate(groups)}
        fold = np.array([gfold[k] for k in key])
    for f in sorted(set(fold.tolist())):
        test = [i for i in range(len(records)) if fold[i] == f]
        train = [i for i in range(len(records)) if fold[i] != f]
        if test and train:
            yield train, test


def record_model(rec: TrainingRecord) -> str:
    """The model name of a record: ``arena:<model>:<batch>:...`` for table rows; measured
    runs (``run:...``) count by their row id (each its own group)."""
    parts = rec.row_id.split(":")
    return parts[1] if parts[0] == "arena" else rec.row_id


def _regressor(correction: str, params: dict):
    """The regressor of a ``CORRECTIONS`` entry (None for ``none``); ``params`` are the
    boosted trees' (the ``group`` correction has none of its own)."""
    if correction == "none":
        return None
    if correction in ("group", "type_level"):
        from .group_correction import TYPE_LEVELS, GroupMedianCorrection
        return GroupMedianCorrection(FEATURES, **({"levels": TYPE_LEVELS} if correction == "type_level" else {}))
    from sklearn.ensemble import GradientBoostingRegressor
    return GradientBoostingRegressor(loss=correction, **params)


def select_scores(records: list[TrainingRecord], params: dict, by: str, *,
                  seed: int = 0) -> tuple[dict[str, float], dict[str, float | None]]:
    """Cross-validated scores of every ``AUTO_CANDIDATES`` entry on ``records`` with folds of
    kind ``by`` (``cv_folds``), from the same out-of-fold predictions: the mean absolute
    percentage error, and the grid-choice score (``choice.choice_score``: mean true
    per-GPU throughput of the shape the predictions rank best over the best, over the
    Arena-table records' groups; None without such groups)."""
    from .choice import choice_score, point_from_row_id
    X = np.array([r.features for r in records])
    y = np.array([r.target for r in records])
    pred = {c: np.zeros(len(records)) for c in AUTO_CANDIDATES}
    seen = np.zeros(len(records), dtype=bool)
    for train, test in cv_folds(records, by, seed=seed):
        seen[test] = True
        for c in AUTO_CANDIDATES:
            reg = _regressor(c, params)
            corr = np.zeros(len(test))
            if reg is not None:
                reg.fit(X[train], y[train])
                corr = reg.predict(X[test])
            pred[c][test] = np.array([records[i].analytic_s for i in test]) * np.exp(corr)
    held = [records[i] for i in np.flatnonzero(seen)]
    mape, choice = {}, {}
    for c in AUTO_CANDIDATES:
        p = pred[c][seen]
        if not len(p):
            continue
        mape[c] = float(np.mean(np.abs(p / np.array([r.measured_s for r in held]) - 1)))
        pts = [point_from_row_id(r.row_id, r.measured_s, e) for r, e in zip(held, p)]
        choice[c] = choice_score([q for q in pts if q is not None])
    return mape, choice


def pick_correction(mape: dict[str, float], choice: dict[str, float | None], metric: str) -> str:
    """The correction ``fit`` keeps: the lowest cross-validated MAPE (``metric="error"``),
    or the highest grid-choice score, ties and missing scores broken by the MAPE
    (``"choice"``)."""
    if metric == "choice" and any(v is not None for v in choice.values()):
        return max(mape, key=lambda c: (round(choice.get(c) or 0.0, 6), -mape[c]))
    return min(mape, key=mape.get)


class LearnedModel:
    """PerformanceModel: analytic estimate x exp(learned log-ratio correction)."""
    kind = "learned"
    name = "learned"

    def __init__(self, *, dp_only: bool = False, artifact: str | Path | None = None,
                 train_on: str | None = "arena-measured", correction: str = "auto", select_by: str = "row",
                 select_metric: str = "error",
                 n_estimators: int = 300, max_depth: int = 3,
                 learning_rate: float = 0.05, seed: int = 0, link_load: float = 0.0, **analytic_config):
        if train_on not in (None, "arena-measured"):
            raise InputError(f"train_on must be 'arena-measured' or None, got {train_on!r}", field="train_on")
        if correction not in CORRECTIONS + ("auto",):
            raise InputError(f"unknown correction {correction!r}; known: auto, {', '.join(CORRECTIONS)}",
                             field="correction")
        if select_by not in SELECT_BY:
            raise InputError(f"unknown select_by {select_by!r}; known: {', '.join(SELECT_BY)}", field="select_by")
        if select_metric not in SELECT_METRICS:
            raise InputError(f"unknown select_metric {select_metric!r}; known: {', '.join(SELECT_METRICS)}",
                             field="select_metric")
        self.correction_kind, self.select_by, self.seed = correction, select_by, seed
        self.select_metric = select_metric
        self.chosen: str | None = None          # the correction in use after fit
        self.selection: dict[str, float] = {}   # cross-validated MAPE per candidate (auto)
        self.choice_selection: dict[str, float | None] = {}   # cross-validated grid-choice score (auto)
        for n, v in (("n_estimators", n_estimators), ("max_depth", max_depth)):
            if not isinstance(v, int) or v < 1:
                raise InputError(f"must be a positive integer, got {v!r}", field=n)
        if not 0 < learning_rate <= 1:
            raise InputError(f"must be in (0, 1], got {learning_rate!r}", field="learning_rate")
        self.analytic = AnalyticModel(dp_only=dp_only, link_load=link_load, **analytic_config)
        self.dp_only = bool(dp_only)
        self.params = dict(n_estimators=n_estimators, max_depth=max_depth, learning_rate=learning_rate,
                           subsample=0.8, random_state=seed)
        self.records: list[TrainingRecord] = []
        self.regressor = None
        self._cache: dict = {}
        if self.dp_only:
            self.name = f"{self.name}-dp"
        if artifact is not None:
            self._load_into(Path(artifact))
        elif train_on == "arena-measured":
            recs = list(_arena_records(self.analytic.cfg))
            store = analytic_config.get("profile_store")
            if store is not None:           # telemetry the launcher appended to the store
                from .profile_store import ProfileStore
                st = store if isinstance(store, ProfileStore) else ProfileStore(store)
                recs += records_from_runs(st.read_measured_runs(), self.analytic)
            self.fit(recs)

    # -- training --------------------------------------------------------------------
    def fit(self, records: list[TrainingRecord]) -> "LearnedModel":
        """Train on ``records``; with ``correction="auto"`` first choose the correction by
        cross-validation on these records alone (``select_scores``, ``pick_correction``)."""
        if len(records) < 5:
            raise ValueError(f"need at least 5 training records, got {len(records)}")
        self.records = list(records)
        if self.correction_kind == "auto":
            self.selection, self.choice_selection = select_scores(self.records, self.params, self.select_by,
                                                                  seed=self.seed)
            self.chosen = pick_correction(self.selection, self.choice_selection, self.select_metric)
        else:
            self.selection, self.choice_selection, self.chosen = {}, {}, self.correction_kind
        self.regressor = _regressor(self.chosen, self.params)
        if self.regressor is not None:
            self.regressor.fit(np.array([r.features for r in self.records]), np.array([r.target for r in self.records]))
        self._cache.clear()
        return self

    def update(self, records) -> "LearnedModel":
        """Online update from telemetry: ``records`` are TrainingRecords or measured-run
        dicts (profile store format); they join the training set and the model is refitted."""
        recs = [r for r in records if isinstance(r, TrainingRecord)]
        runs = [r for r in records if isinstance(r, dict)]
        recs += records_from_runs(runs, self.analytic)
        known = {r.row_id for r in self.records}
        return self.fit(self.records + [r for r in recs if r.row_id not in known])

    def correction(self, feats: tuple[float, ...]) -> float:
        if self.regressor is None:
            return 1.0
        return float(math.exp(self.regressor.predict(np.array([feats]))[0]))

    def predict_records(self, records: list[TrainingRecord]) -> np.ndarray:
        analytic = np.array([r.analytic_s for r in records])
        if self.regressor is None:
            return analytic
        return analytic * np.exp(self.regressor.predict(np.array([r.features for r in records])))

    # -- PerformanceModel --------------------------------------------------------------
    def estimate(self, job: Job, grid: Grid, *, link_load: float | None = None) -> Estimate:
        load = self.analytic.link_load if link_load is None else float(link_load)
        key = (job.model, job.global_batch, grid, load)
        e = self._cache.get(key)
        if e is None:
            base = self.analytic.estimate(job, grid, link_load=load)
            if base.plan is None or not math.isfinite(base.iteration_time_s):
                e = Estimate(base.iteration_time_s, base.throughput, base.peak_memory_bytes, base.plan,
                             base.feasible, f"{self.name}/{base.source}", base.notes)
            else:
                r = self.analytic.plan_result(job, grid, load)
                s = grid.shape
                k = self.correction(features(job.model, s.gpu_type, s.num_nodes, s.gpus_per_node, r, load,
                                                     self.analytic.cfg.efficiency))
                t = base.iteration_time_s * k
                e = Estimate(t, job.global_batch / t, base.peak_memory_bytes, base.plan, base.feasible,
                             f"{self.name}/{base.source}",
                             base.notes + (f"learned correction x{k:.3f} ({self.chosen})",))
            self._cache[key] = e
        return e

    # -- artifact --------------------------------------------------------------------
    def save(self, path: str | Path, field: str | None = None) -> Path:
        """Write the artifact to ``path``, whole or not at all (``instances.paths.write_output``:
        a failed write, e.g. a full disk, is an ``InputError`` naming ``path`` and ``field``)."""
        import io

        import joblib

        from instances.paths import write_output
        buf = io.BytesIO()
        joblib.dump({"artifact_version": ARTIFACT_VERSION, "features": FEATURES, "params": self.params,
                     "correction": self.chosen, "selection": self.selection, "select_by": self.select_by,
                     "regressor": self.regressor, "records": self.records}, buf)
        return write_output(path, buf.getvalue(), field)

    def _load_into(self, path: Path) -> None:
        import joblib
        if not path.exists():
            raise InputError("learned model artifact not found", file=str(path))
        blob = joblib.load(path)
        if not isinstance(blob, dict) or blob.get("artifact_version") != ARTIFACT_VERSION:
            version = blob.get('artifact_version') if isinstance(blob, dict) else None
            raise InputError(f"unsupported artifact version {version!r}, "
                             f"expected {ARTIFACT_VERSION}", file=str(path), field="artifact_version")
        if tuple(blob["features"]) != FEATURES:
            raise InputError("artifact built with another feature list", file=str(path), field="features")
        self.params, self.regressor, self.records = blob["params"], blob["regressor"], list(blob["records"])
        self.chosen, self.selection, self.select_by = blob["correction"], blob["selection"], blob["select_by"]
        self._cache.clear()

    @classmethod
    def load(cls, path: str | Path, **config) -> "LearnedModel":
        return cls(artifact=path, **config)


class LearnedChoiceModel(LearnedModel):
    """The kind ``learned-choice``: the correction chosen by cross-validated grid choice
    (``select_metric="choice"``) rather than by error, for deciding grids."""
    kind = "learned-choice"
    name = "learned-choice"

    def __init__(self, **config):
        super().__init__(**{"select_metric": "choice", **config})


class LearnedLevelModel(LearnedModel):
    """The kind ``learned-level``: the ``type_level`` correction, one factor per (model
    family, GPU type), so it ranks the shapes of one GPU type as the analytic model does
    and corrects only the level between types (docs/estimators.md, "Grid choice")."""
    kind = "learned-level"
    name = "learned-level"

    def __init__(self, **config):
        if "correction" in config:
            raise InputError("learned-level sets its own correction (type_level); use --perf learned to choose one",
                             field="correction")
        super().__init__(correction="type_level", **config)
