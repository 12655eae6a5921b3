"""The one optimizing-policy runner: context -> round data -> model -> solver -> decisions
with ranked fallback columns (the round's placement takes them where a grid does not fit).

``arena``, ``sia`` and ``gavel`` are registrations of ``MilpPolicy`` that differ only in
their ``MilpPolicySpec``: default objective weights and term options, whether they
decide from data-parallel-only estimates (as the published comparisons configured the
baselines) and which candidate grids they keep. Every knob they accept is validated
here, once:

- ``backend`` (solver backend name, default ``auto``), ``time_limit_s`` (10), ``rel_gap``
  (0.01), ``threads`` (1), ``seed`` (0): the solver;
- ``max_gpus`` (16): the largest grid a job may get;
- ``columns``: ``all`` (every shape and pipeline depth of a GPU type and count; the
  default of ``arena``, ``suika``, ``sia``, ``gavel``) or ``best_per_count`` (only the
  planner's best shape and depth per GPU type and count; the default of the ``-ap``
  variants): which candidate columns the round keeps, so that co-designed placement and
  adaptive parallelism alone can be compared under one objective;
- ``pinned_jobs``: comma-separated job ids that must be scheduled;
- ``stability``, ``payback``, ``payback_max_s``, ``max_moves_per_hour``,
  ``max_changes_per_job``, ``move_backoff_s``, ``change_budget_per_job``: the stability rule
  (engine/decide/stability.py): running jobs it freezes keep their current grid;
- ``dump_rounds_dir``: write every round's model as MPS and LP files there;
- ``max_queued`` (0: none): the round decides over every running job and at most this
  many queued jobs, those of the highest priority, then the earliest arrival, then the
  job id (``queue_window``); the others wait this round (``DecisionStats.queued_left_out``).
  A queue of thousands on a cluster that can start a few jobs a round otherwise costs
  its estimates, columns and solve every round (docs/results/2026-12-04-service-round-scale.md);
- ``event_driven`` (false): decide only after an event (arrival, completion, failure) or
  when the last decisions were not all carried out, not every round — a faster replay
  whose results differ (time-dependent terms and the stability rule's thawing are seen
  only at the next event);
- ``search``: ``milp`` (the full per-round model, default) or ``incremental`` (the
  expand/balance search from the current allocation on the same model restricted to a
  neighbourhood of candidate columns, ``engine/decide/incremental``), with
  ``queued_candidates`` (``all``/``small``), ``other_type_candidates`` (``same``/``any``:
  a running job's candidates on another GPU type), ``move_budget_jobs`` and
  ``move_budget_gpus`` (fractions of the running jobs and of the cluster's GPUs that
  may move per round; 1 = no budget);
- ``max_refines`` (16): when placement cannot map a chosen column, decide the round
  again without it (``Decisions.refine``, engine/core/round_placement.py), at most this
  many times a round, before its fallbacks are taken; 0: fallbacks at once;
- ``held_rows`` (false; true in ``arena``'s goodput preset): true makes the node-shape
  rows count the GPUs running jobs keep (``RoundData.held``) instead of the whole
  capacity as free: fewer columns placement cannot map, but counted low where several
  jobs leave one node, so that consolidating a node is never seen, and a harder model
  (on arena-philly, with 3 refinements, 6% fewer jobs finished in 2,000 rounds and a p99
  decision time 6x; docs/results/2026-12-06-decisions-that-win.md);
- ``w_<term>=weight`` and ``<term>.<option>=value``: the objective (engine/decide/objectives).

The objective, the stability rule, ``max_gpus`` and ``held_rows`` may differ by kind of
job: a spec's ``goodput_preset`` gives their defaults on goodput jobs (``arena``'s). The
user's options apply to both kinds; a ``<term>.<option>`` goes to the kind(s) whose
objective has that term.

An option the policy would not read is refused, never ignored: the solver's options
(``SOLVER_KEYS``) given with ``search=incremental``, the search's (``INCREMENTAL_KEYS``)
with ``search=milp``; and before the first round (``check_workload``) the goodput
policy's options and the options of a term on for goodput jobs only on fixed-batch jobs,
the options of a term off in the goodput preset on goodput jobs, and on goodput jobs that
a ``goodput`` policy decides every runner and objective option but ``max_queued`` and
``event_driven`` (the round loop reads those).

Candidate grids are cached per (model, global batch); estimates and each job's columns
per performance model (``RoundDataCache``); the model's rows before the objective terms,
while their inputs stay equal (``RowsMemo``). Frozen jobs (the stability rule) keep exactly
their current column in both searches: the round data keeps only that column for them;
the full model fixes it at 1 outside the model (capacity taken from the rows, no lower
bound on a job row, so the fast Lagrangian path stays open), the incremental search
keeps it. Hysteresis is in the objective (``reconfig.hysteresis``), so both searches see
it.
The solver's hint is what every job runs now. A solver exception becomes a greedy
decision (status ``error``, with the reason): a round never crashes.

Rounds of the Sia artifact's adaptive-batch goodput jobs (instances/goodput.py) go to the
spec's ``goodput`` policy when it has one (the baseline as its authors' simulator runs
it: engine/decide/policies/sia_goodput.py, gavel_goodput.py); the options it names
(``goodput_options``) are its own, the others the runner's; one both read (``sia``'s
``time_limit_s``, ``rel_gap``) goes to both. A spec without one (``arena``)
decides them with its own objective over goodput columns
(engine/decide/formulation/goodput_data.py): every GPU type and shape valued at the batch the
job would choose there, each job adapting its batch within the application's limits.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from engine.core.context import Decisions, DecisionStats, JobView, RoundContext
from engine.core.policy import Policy, Workload, refuse_unknown_options, refuse_unread, register_policy
from engine.core.round_placement import MAX_REFINES
from estimators import PerformanceModel
from estimators.perf import DpOnlyTwin
from instances.cluster import MAX_CLUSTER_GPUS
from instances.errors import InputError
from instances.grid import Grid
from instances.limits import MAX_TIME_S, show_number

from ..fallbacks import RankedColumns
from ..formulation import build_model, build_round_data
from ..formulation.build import RowsMemo
from ..formulation.goodput_data import build_goodput_round_data
from ..formulation.model import MilpModel
from ..formulation.round_data import GridCache, RoundDataCache, best_plan_per_count, find_column, freeze_jobs
from ..incremental import OTHER_TYPE_CHOICES, QUEUED_CHOICES, IncrementalConfig, search_round
from ..objectives import Objective, parse_objective, split_objective_config
from ..solvers import BackendUnavailable, Solution, SolverBackend, SolverOptions, make_backend
from ..solvers.base import MAX_SOLVER_SEED
from ..solvers.greedy import greedy_solution
from ..stability import STABILITY_KEYS, StabilityRule, parse_bool
from .goodput_rounds import goodput_model, goodput_round

GridFilter = Callable[[JobView, Grid], bool]

# Knobs every optimizing policy accepts (besides its objective keys w_<term>, <term>.<opt>).
RUNNER_KEYS = ("backend", "time_limit_s", "rel_gap", "max_gpus", "columns", "threads", "seed", "pinned_jobs",
               "dump_rounds_dir", "search", "queued_candidates", "other_type_candidates", "move_budget_jobs",
               "move_budget_gpus", "max_queued",
               "event_driven", "max_refines", "held_rows") + STABILITY_KEYS
SEARCHES = ("milp", "incremental")
SOLVER_KEYS = ("backend", "time_limit_s", "rel_gap", "threads", "seed")     # read by search=milp only
INCREMENTAL_KEYS = ("queued_candidates", "other_type_candidates", "move_budget_jobs", "move_budget_gpus")
LOOP_KEYS = ("max_queued", "event_driven")     # read by the round loop, whoever decides the round
COLUMNS = ("all", "best_per_count")


@dataclass(frozen=True)
class Preset:
    """Defaults for one kind of job: objective weights, term options and runner options
    (of the kind-dependent knobs: the objective, the stability rule, ``max_gpus``,
    ``held_rows``)."""
    weights: Mapping[str, float]
    options: Mapping[str, Any] = field(default_factory=dict)
    runner: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MilpPolicySpec:
    """What distinguishes one optimizing policy from another."""
    name: str
    weights: Mapping[str, float]                          # default objective weights
    options: Mapping[str, Any] = field(default_factory=dict)   # default term options
    dp_only: bool = False                                 # decide from data-parallel-only estimates
    grid_filter: GridFilter | None = None                 # candidate grids it keeps
    backend: str = "auto"
    # ``-ap`` variants: per GPU type and count, only the planner's best shape and depth
    # (the default of the ``columns`` option)
    best_plan_per_count: bool = False
    searches: tuple[str, ...] = SEARCHES                  # allowed; the first is the default
    runner: Mapping[str, Any] = field(default_factory=dict)   # default runner options (e.g. budgets)
    # rounds of goodput jobs (instances/goodput.py): the policy that decides them, built
    # with (name, **options) from the options named in ``goodput_options``
    goodput: Callable[..., Any] | None = None
    goodput_options: tuple[str, ...] = ()
    # rounds of goodput jobs decided by this runner (no ``goodput`` policy): the defaults
    # there, in place of ``weights``, ``options`` and ``runner`` (None: the same as on
    # fixed-batch jobs). The user's options apply to both kinds.
    goodput_preset: Preset | None = None


def solve_safely(backend: SolverBackend, model: MilpModel, time_limit_s: float, hint: np.ndarray | None,
                 rel_gap: float) -> Solution:
    """The backend's solution; any exception becomes a greedy decision (status "error")."""
    try:
        return backend.solve(model, time_limit_s, hint=hint, rel_gap=rel_gap)
    except BackendUnavailable:
        raise
    except Exception as e:          # a round never crashes: decide greedily and say why
        return greedy_solution(model, backend=getattr(backend, "name", "?"), status="error",
                               message=f"{type(e).__name__}: {e}; greedy decision")


def queue_window(ctx: RoundContext, max_queued: int) -> tuple[RoundContext, int]:
    """``ctx`` with every running job and at most ``max_queued`` queued ones (0: all):
    those of the highest priority, then the earliest arrival, then the job id. Returns
    it and how many queued jobs were left out, with those the round loop left out
    already (``ctx.queued_left_out``: it builds views only for this window when the
    policy has ``max_queued``); the jobs keep ``ctx``'s order."""
    queued = [v for v in ctx.jobs if v.current is None]
    if max_queued <= 0 or len(queued) <= max_queued:
        return ctx, ctx.queued_left_out
    keep = {id(v) for v in heapq.nsmallest(max_queued, queued,
                                            key=lambda v: (-v.job.priority, v.job.arrival_s, v.job.job_id))}
    jobs = tuple(v for v in ctx.jobs if v.current is not None or id(v) in keep)
    left_out = ctx.queued_left_out + len(queued) - max_queued
    return dataclasses.replace(ctx, jobs=jobs, queued_left_out=left_out), left_out


def parse_job_list(value: object) -> frozenset[str]:
    if value is None or value == "":
        return frozenset()
    if isinstance(value, str):
        return frozenset(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, (list, tuple, set, frozenset)):
        return frozenset(str(v) for v in value)
    raise InputError(f"expected comma-separated job ids, got {value!r}", field="pinned_jobs")


def _number(policy: str, rest: Mapping[str, Any], key: str, default: float, cast: type, lo: float,
            hi: float = math.inf) -> Any:
    raw = rest.get(key, default)
    try:
        v = cast(raw)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"policy {policy!r}: {key} must be a number, got {raw!r}", field=key) from None
    if cast is int and v != raw:                      # 1.5 threads is not 1 thread
        raise InputError(f"policy {policy!r}: {key} must be a whole number, got {raw!r}", field=key)
    if not (lo <= v <= hi and (cast is int or math.isfinite(v))):
        bound = f">= {lo}" if hi == math.inf else f"in [{lo}, {hi:g}]" if isinstance(hi, float) and hi >= 1e6 \
            else f"in [{lo}, {hi}]"
        raise InputError(f"policy {policy!r}: {key} must be a finite number {bound}, got {show_number(raw)}",
                         field=key)
    return v


def _with_default_options(defaults: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The default term options under the user's config; the defaults of a term the user
    switched off (``w_<term>=0``) go too."""
    merged = {**defaults, **config}
    for key in defaults:
        term = key.split(".", 1)[0]
        if key in config or f"w_{term}" not in config:
            continue
        try:
            off = float(config[f"w_{term}"]) == 0.0
        except (TypeError, ValueError, OverflowError):
            off = False                 # parse_objective reports the bad weight
        if off:
            merged.pop(key)
    return merged


DEFAULT_MAX_GPUS = 16
DEFAULT_MAX_REFINES = 16     # on arena-philly's 2,000 rounds no chosen grid waits with 16 (17 with 8)


@dataclass(frozen=True)
class Knobs:
    """What decides a round of one kind of job: the objective, the stability rule, the
    largest grid a job may get and whether the node-shape rows count what running jobs
    hold (``held_rows``)."""
    objective: Objective
    stability: StabilityRule
    max_gpus: int
    held_rows: bool


def _term_weights(defaults: Mapping[str, float], config: Mapping[str, Any]) -> dict[str, float]:
    """The terms' weights: the defaults under the user's ``w_<term>`` (a weight that is not
    a number counts as on: the objective's parse reports it)."""
    out = dict(defaults)
    for k, v in config.items():
        if k.startswith("w_"):
            try:
                out[k[2:]] = float(v)
            except (TypeError, ValueError, OverflowError):
                out[k[2:]] = 1.0
    return out


def _one_kind_options(spec: MilpPolicySpec, config: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """The user's term options (``<term>.<option>``) whose term is on for goodput jobs only
    (its ``goodput_preset``), and those whose term is on for fixed-batch jobs only: each is
    given to that kind's objective alone. An option whose term is off for both is left in
    both, for the objective's parse to refuse."""
    if spec.goodput_preset is None:
        return frozenset(), frozenset()
    fixed = _term_weights(spec.weights, config)
    goodput = _term_weights(spec.goodput_preset.weights, config)
    goodput_only, fixed_only = set(), set()
    for k in config:
        if "." not in k or k.startswith("w_"):
            continue
        term = k.split(".", 1)[0]
        on_fixed, on_goodput = fixed.get(term, 0.0) > 0, goodput.get(term, 0.0) > 0
        if on_goodput and not on_fixed:
            goodput_only.add(k)
        elif on_fixed and not on_goodput:
            fixed_only.add(k)
    return frozenset(goodput_only), frozenset(fixed_only)


def _preset_knobs(name: str, preset: Preset, config: Mapping[str, Any]) -> Knobs:
    """The knobs of ``preset`` under the user's ``config`` (already checked against the
    runner's keys by the fixed-batch parse)."""
    obj_cfg, rest = split_objective_config(_with_default_options(preset.options, {**preset.runner, **config}))
    return Knobs(parse_objective(obj_cfg, preset.weights), StabilityRule.from_config(name, rest),
                 _number(name, rest, "max_gpus", DEFAULT_MAX_GPUS, int, 1, MAX_CLUSTER_GPUS),
                 parse_bool(name, "held_rows", rest.get("held_rows", False)))


class MilpPolicy(Policy):
    """One optimization model per round over every job x candidate grid (see module doc)."""

    def __init__(self, spec: MilpPolicySpec, **config: Any):
        self.spec = spec
        self.name = spec.name
        self.given = frozenset(config)                  # what the user set (not the spec's defaults)
        goodput_cfg = {k: config[k] for k in config if k in spec.goodput_options}
        for k in goodput_cfg:           # (an option both read stays the runner's too)
            if k not in RUNNER_KEYS:
                config.pop(k)
        self._goodput = spec.goodput(spec.name, **goodput_cfg) if spec.goodput is not None else None
        # term options read on one kind of job only (their term is off on the other)
        self._goodput_only, fixed_only = _one_kind_options(spec, config)
        fixed_cfg = {k: v for k, v in config.items() if k not in self._goodput_only}
        obj_cfg, rest = split_objective_config(_with_default_options(spec.options, {**spec.runner, **fixed_cfg}))
        refuse_unknown_options(spec.name, rest, RUNNER_KEYS,
                               known_text=f"{sorted(RUNNER_KEYS)} and w_<term>, <term>.<option>")
        self.objective: Objective = parse_objective(obj_cfg, spec.weights)
        options = SolverOptions(threads=_number(spec.name, rest, "threads", 1, int, 1),
                                seed=_number(spec.name, rest, "seed", 0, int, 0, MAX_SOLVER_SEED))
        self.backend: SolverBackend = make_backend(str(rest.get("backend", spec.backend)), options)
        self.time_limit_s: float = _number(spec.name, rest, "time_limit_s", 10.0, float, 0.01, MAX_TIME_S)
        self.rel_gap: float = _number(spec.name, rest, "rel_gap", 0.01, float, 0.0, 1.0)
        self.max_gpus: int = _number(spec.name, rest, "max_gpus", DEFAULT_MAX_GPUS, int, 1, MAX_CLUSTER_GPUS)
        columns = str(rest.get("columns", "best_per_count" if spec.best_plan_per_count else "all"))
        if columns not in COLUMNS:
            raise InputError(f"policy {spec.name!r}: columns must be one of {', '.join(COLUMNS)}, got {columns!r}",
                             field="columns")
        self.best_per_count = columns == "best_per_count"
        self.pinned = parse_job_list(rest.get("pinned_jobs"))
        self.max_queued: int = _number(spec.name, rest, "max_queued", 0, int, 0)
        self.stability = StabilityRule.from_config(spec.name, rest)
        self.max_refines: int = _number(spec.name, rest, "max_refines", DEFAULT_MAX_REFINES, int, 0, MAX_REFINES)
        self._fixed_knobs = Knobs(self.objective, self.stability, self.max_gpus,
                                  parse_bool(spec.name, "held_rows", rest.get("held_rows", False)))
        self._fixed_only = fixed_only
        self._goodput_knobs = self._fixed_knobs if spec.goodput_preset is None else \
            _preset_knobs(spec.name, spec.goodput_preset, {k: v for k, v in config.items() if k not in fixed_only})
        self.event_driven = parse_bool(spec.name, "event_driven", rest.get("event_driven", False))
        self.dump_rounds_dir: str | None = rest.get("dump_rounds_dir") or None
        self.search: str = str(rest.get("search", spec.searches[0]))
        if self.search not in spec.searches:
            raise InputError(f"policy {spec.name!r}: search must be one of {', '.join(spec.searches)}, "
                             f"got {self.search!r}", field="search")
        queued = str(rest.get("queued_candidates", "all"))
        if queued not in QUEUED_CHOICES:
            raise InputError(f"policy {spec.name!r}: queued_candidates must be one of {', '.join(QUEUED_CHOICES)}, "
                             f"got {queued!r}", field="queued_candidates")
        other = str(rest.get("other_type_candidates", "same"))
        if other not in OTHER_TYPE_CHOICES:
            raise InputError(f"policy {spec.name!r}: other_type_candidates must be one of "
                             f"{', '.join(OTHER_TYPE_CHOICES)}, got {other!r}", field="other_type_candidates")
        budgets = {}
        for key in ("move_budget_jobs", "move_budget_gpus"):
            budgets[key] = _number(spec.name, rest, key, 1.0, float, 0.0)
            if budgets[key] > 1.0:
                raise InputError(f"policy {spec.name!r}: {key} is a fraction in [0, 1], got {budgets[key]}",
                                 field=key)
        self.incremental = IncrementalConfig(queued=queued, other_type=other, **budgets)
        unread = SOLVER_KEYS if self.search == "incremental" else INCREMENTAL_KEYS
        bad = sorted(self.given & set(unread))
        if bad:
            raise InputError(f"policy {spec.name!r}: option {bad[0]} is not read with search={self.search} (the "
                             f"{'solver' if self.search == 'incremental' else 'incremental search'}'s option); "
                             f"drop {', '.join(bad)}", field=bad[0])
        self._grids = GridCache(dp_only=spec.dp_only)
        self._dp_only = DpOnlyTwin()
        self._cache = RoundDataCache()
        self._rows = RowsMemo()

    def check_workload(self, workload: Workload) -> None:
        """Refuse an option this policy would not read on ``workload`` (module doc)."""
        if not workload.goodput:
            unread = (set(self.spec.goodput_options) - set(RUNNER_KEYS)) | self._goodput_only
            refuse_unread(self.name, self.given, unread, workload,
                          "it is read only on the Sia artifact's goodput jobs (--instance sia:TRACE/WORKLOAD)")
        elif self._goodput is None:
            refuse_unread(self.name, self.given, self._fixed_only, workload,
                          "its term is off in the policy's goodput preset there (switch it on with w_<term>)")
        elif self._goodput is not None:
            refuse_unread(self.name, self.given, self.given - set(self.spec.goodput_options) - set(LOOP_KEYS),
                          workload, f"there {type(self._goodput).__name__} decides, which reads "
                                    f"{', '.join(self.spec.goodput_options)} (and max_queued, event_driven)")
            check = getattr(self._goodput, "check_workload", None)
            if callable(check):
                check(workload)

    # ------------------------------------------------------------------------------
    def _perf(self, perf: PerformanceModel | None) -> PerformanceModel:
        if self.spec.dp_only:
            return self._dp_only(perf)
        if perf is None:
            raise InputError(f"policy {self.name!r} decides from a performance model; none was given", field="perf")
        return perf

    def _keep(self, view: JobView, grid: Grid) -> bool:
        if grid.shape in view.known_infeasible_shapes:
            return False
        return self.spec.grid_filter is None or self.spec.grid_filter(view, grid)

    def decide(self, ctx: RoundContext) -> Decisions:
        goodput = bool(ctx.jobs) and goodput_round(ctx)
        if goodput and self._goodput is not None:
            return self._goodput.decide(ctx)
        t0 = time.perf_counter()
        knobs = self._goodput_knobs if goodput else self._fixed_knobs
        ctx, left_out = queue_window(ctx, self.max_queued)
        if goodput:                     # columns valued by goodput at the best batch per shape
            data = build_goodput_round_data(ctx, goodput_model(ctx), knobs.max_gpus, held=knobs.held_rows)
        else:
            perf = self._perf(ctx.perf)
            data = build_round_data(ctx, perf, grids_fn=self._grids, max_gpus=knobs.max_gpus,
                                    grid_filter=self._keep, cache=self._cache, held=knobs.held_rows)
        if self.best_per_count:
            data = best_plan_per_count(data)
        frozen = knobs.stability.frozen(ctx)
        allowance = knobs.stability.round_allowance(ctx)
        if frozen:
            data = freeze_jobs(data, frozen)
            frozen = frozenset(jid for j, jid in enumerate(data.job_ids) if jid in frozen and data.current_col[j] >= 0)
        prepared = _Prepared(ctx, data, knobs.objective, frozen, allowance, left_out, t0, time.perf_counter())
        return self._solve(prepared, None, self.max_refines)

    def _solve(self, r: _Prepared, exclude: np.ndarray | None, refines_left: int) -> Decisions:
        """The round's decision over ``r``'s columns, less those ``exclude`` marks (the
        columns placement could not map, ``_Refinement``)."""
        data, frozen, allowance = r.data, r.frozen, r.allowance
        t1 = time.perf_counter()
        cols: np.ndarray | None
        fixed = np.zeros(0, dtype=np.int64)
        if self.search == "incremental":
            model, cols, sol = search_round(data, r.objective, self.incremental, self.pinned, frozen, allowance,
                                            exclude=exclude)
            t2 = t1                                 # the restricted model is built inside the search
        else:
            # frozen jobs' (only) columns are fixed at 1, outside the model: its capacity rows
            # shrink by what they hold, and no job row gets a lower bound (the fast path stays open)
            fixed = np.sort(np.array([data.current_col[j] for j, jid in enumerate(data.job_ids) if jid in frozen],
                                     dtype=np.int64))
            free = np.ones(data.n_cols, dtype=bool)
            if exclude is not None:
                free &= ~exclude
            free[fixed] = False
            cols = np.flatnonzero(free) if len(fixed) or exclude is not None else None
            model = build_model(data, r.objective, self.pinned, cols, fixed if len(fixed) else None,
                                max_moves=allowance or None, memo=self._rows)
            t2 = time.perf_counter()
            hint = np.zeros(model.n_x)
            cur = data.current_col[data.current_col >= 0]
            if cols is not None:
                cur = np.searchsorted(cols, cur[free[cur]])
            hint[cur] = 1.0
            sol = solve_safely(self.backend, model, self.time_limit_s, hint, self.rel_gap)
        t3 = time.perf_counter()
        if not _finite(model):
            raise InputError(f"policy {self.name!r}: the round's model holds a NaN or infinite coefficient or bound, "
                             f"added by objective term(s) {', '.join(_nonfinite_terms(data, self.objective))}",
                             field="objective")
        if cols is None:
            col_value = model.c[: model.n_x]
        else:                                       # columns outside the model rank last
            col_value = np.full(data.n_cols, -np.inf)
            col_value[cols] = model.c[: model.n_x]
        sel = sol.selected(model.n_x)
        if cols is not None:
            sel = cols[sel]
        if len(fixed):
            sel = np.concatenate([sel, fixed])          # the frozen jobs keep their columns
            col_value[fixed] = 0.0
        chosen = {int(data.col_job[k]): int(k) for k in sel.tolist()}
        grids: dict[str, Grid] = {}
        plans = {}
        for j, k in chosen.items():
            jid = data.job_ids[j]
            grid = data.grids[k]
            assert grid is not None, "a chosen column of a real round has a grid"
            grids[jid] = grid
            if data.plans[k] is not None:
                plans[jid] = data.plans[k]
        if self.dump_rounds_dir and exclude is None:
            from ..solvers.pulp_backend import export_model
            d = Path(self.dump_rounds_dir)
            d.mkdir(parents=True, exist_ok=True)
            export_model(model, d / f"round_{r.ctx.round_index:05d}.mps", "mps")
            export_model(model, d / f"round_{r.ctx.round_index:05d}.lp", "lp")
        stats = DecisionStats(
            jobs=data.n_jobs, queued_left_out=r.left_out, frozen=len(frozen), move_allowance=allowance,
            backend=sol.backend, status=sol.status, objective=sol.objective, bound=sol.bound, gap=sol.gap,
            message=sol.message, solver_build_time_s=sol.build_time_s, solver_solve_time_s=sol.solve_time_s,
            solver_extra=dict(sol.extra), search=self.search, columns=data.n_cols, rows=model.n_rows,
            unschedulable=tuple(data.unschedulable), estimate_time_s=r.t1 - r.t0, model_build_time_s=t2 - t1,
            solve_wall_s=t3 - t2, decide_time_s=time.perf_counter() - t1 + r.t1 - r.t0)
        return Decisions(grids=grids, plans=plans, stats=stats, fallbacks=RankedColumns(data, col_value),
                         refine=_Refinement(self, r, exclude, refines_left - 1) if refines_left > 0 else None)


@dataclass(frozen=True)
class _Prepared:
    """A round's data, ready to solve (``MilpPolicy.decide``), kept for its refinements."""
    ctx: RoundContext
    data: Any                       # RoundData
    objective: Objective
    frozen: frozenset[str]
    allowance: int | None
    left_out: int
    t0: float
    t1: float


class _Refinement:
    """``Decisions.refine`` of a MilpPolicy decision: the same round solved again without
    the columns placement could not map, and without those of earlier refinements; the
    decision it returns can be refined ``left`` more times."""

    def __init__(self, policy: MilpPolicy, prepared: _Prepared, exclude: np.ndarray | None, left: int):
        self._policy, self._prepared, self._exclude, self._left = policy, prepared, exclude, left

    def without(self, failed: Mapping[str, Grid]) -> Decisions:
        data = self._prepared.data
        exclude = np.zeros(data.n_cols, dtype=bool) if self._exclude is None else self._exclude.copy()
        row = {jid: j for j, jid in enumerate(data.job_ids)}
        for jid, grid in failed.items():
            j = row.get(jid)
            k = find_column(data, j, grid) if j is not None else -1
            if k >= 0:
                exclude[k] = True
        return self._policy._solve(self._prepared, exclude, self._left)


def _finite(model: MilpModel) -> bool:
    """Whether the model's coefficients are finite and its bounds are no NaN (the solver
    would stop on one, or return garbage)."""
    return bool(np.isfinite(model.A.data).all() and np.isfinite(model.c).all() and not any(
        np.isnan(a).any() for a in (model.row_lb, model.row_ub, model.col_lb, model.col_ub)))


def _nonfinite_terms(data, objective: Objective) -> list[str]:
    """The weighted terms whose own rows or coefficients are not finite (each applied alone)."""
    from instances.plugins import defined_in

    from ..formulation.model import ModelBuilder
    out = []
    for w, term in objective.terms:
        b = ModelBuilder(data.n_cols, data.col_job, data.n_jobs)
        try:
            term.apply(data, b, w)
            ok = _finite(b.build())
        except ValueError:
            ok = False
        if not ok:
            where = defined_in(term)
            out.append(f"{term.name}" + (f" (plug-in {where})" if where else ""))
    return out or ["(none alone: their sum)"]


def register_milp_policy(spec: MilpPolicySpec) -> Callable[..., Policy]:
    """Register ``spec`` as a policy: ``make_policy(spec.name, **config)`` builds a MilpPolicy."""
    def factory(**config: Any) -> MilpPolicy:
        return MilpPolicy(spec, **config)
    factory.__name__ = f"make_{spec.name.replace('-', '_')}"
    factory.__doc__ = f"The {spec.name!r} optimizing policy (engine.decide.policies.milp.MilpPolicy)."
    return register_policy(spec.name)(factory)
