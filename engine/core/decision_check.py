"""A policy's decision, checked before the round carries it out: ``decide(policy, ctx)``.

Whatever a policy returns, or raises, the round either gets well-formed ``Decisions`` or
stops with one ``PolicyError`` (an ``InputError``: one line, exit status 2) that names the
policy, the plug-in file that defines it when it is a plug-in's (and the line, for an
exception), and the field at fault. Never a traceback, never a decision taken in part
(``docs/bad-inputs.md``, "Plug-in decisions"):

- ``decide`` raised: its exception, where it was raised (the plug-in's own frame first),
  field ``decide``; an ``InputError`` a built-in policy raises (such as "goodput jobs
  need the goodput model") passes as it is;
- not a ``Decisions`` (``None``, a dict, a string): field ``return``;
- ``grids``: a mapping of the round's job ids (a job not in the context: unknown,
  finished, backing off or outside the queue window) to ``Grid`` values of a GPU type
  the cluster has, with at least one node and one GPU per node, whole numbers, and a
  pipeline depth that divides the GPUs;
- ``plans``: a ``Plan`` (of the grid's GPUs and depth) or a ``BatchPlan``, for a job given
  a grid;
- ``placements`` (pins): for a job given a grid, its GPUs as (node, index) pairs of
  integers, each a GPU of the cluster, none twice, on nodes in service of the grid's
  type, as many nodes as the grid has with its GPUs per node on each, and no GPU also
  pinned for another job or held by a running job the decision keeps where it is (same
  shape, not pinned): the round's placement would otherwise replace the pin without a word;
- ``stats`` a ``DecisionStats``; ``fallbacks`` None or an object with ``smaller(job, grid)``,
  whose answers are checked as they are taken (``CheckedFallbacks``); ``refine`` None or
  an object with ``without(failed)``, whose new decisions are checked as these are
  (``CheckedRefine``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.plan import BatchPlan, JobPlan, Plan

from .context import Decisions, DecisionStats, RoundContext
from .policy import POLICIES, Policy


class PolicyError(InputError):
    """A policy's decision (or its failure to decide) that the round cannot carry out."""


def origin(policy: object) -> str | None:
    """The plug-in file (or module) that defines ``policy``, None for a built-in one."""
    from instances.plugins import defined_in
    name = getattr(policy, "name", None)
    registered = POLICIES.origin(name) if isinstance(name, str) else None
    return registered or defined_in(policy)


class _Errors:
    """Refusals of one policy's decision in one round, each naming the policy and where."""

    def __init__(self, policy: object, ctx: RoundContext):
        self.name = getattr(policy, "name", type(policy).__name__)
        self.file = origin(policy)
        self.ctx = ctx

    def __call__(self, field: str, msg: str, *, file: str | None = None, line: int | None = None) -> PolicyError:
        """The refusal: the plug-in's file (``file``, and ``line``) leads, as an input file's does."""
        return PolicyError(f"policy {self.name!r}, round {self.ctx.round_index}: {msg}", file=file or self.file,
                           line=line, field=field)


def decide(policy: Policy, ctx: RoundContext) -> Decisions:
    """``policy.decide(ctx)``, checked (module doc)."""
    err = _Errors(policy, ctx)
    try:
        decisions = policy.decide(ctx)
    except InputError as e:
        if err.file is None:             # a built-in policy's own refusal says what it is about
            raise
        raise _raised(err, e, e.reason.removeprefix(f"policy {err.name!r}: "), e.field or "decide",
                      quote_site=False) from e
    except Exception as e:               # (KeyboardInterrupt and SystemExit stay what they are)
        raise _raised(err, e, f"{type(e).__name__}: {e}", "decide") from e
    return checked(decisions, ctx, err)


def checked(decisions: Any, ctx: RoundContext, err: _Errors) -> Decisions:
    """``decisions`` checked (``check``), its fallbacks and refinements checked as they are
    taken."""
    check(decisions, ctx, err)
    if decisions.fallbacks is None and decisions.refine is None:
        return decisions
    return replace(decisions,
                   fallbacks=None if decisions.fallbacks is None else CheckedFallbacks(decisions.fallbacks, err),
                   refine=None if decisions.refine is None else CheckedRefine(decisions.refine, ctx, err))


def _raised(err: _Errors, e: BaseException, what: str, field: str, *, quote_site: bool = True) -> PolicyError:
    """The refusal of a policy that raised ``e``: where it was raised leads (the plug-in's
    own line when it is one); raised in the project's code a plug-in called, that place is
    quoted after the reason (``quote_site``: an exception's, not an InputError's, which
    says what it is about)."""
    from instances.plugins import failure_site
    site = failure_site(e)
    file, line = site if site is not None else (None, None)
    if err.file is not None and site is not None and file != err.file:
        if quote_site:
            what += f" ({file}, line {line})"
        file, line = err.file, None
    return err(field, f"failed to decide: {what}", file=file, line=line)


def check(decisions: Any, ctx: RoundContext, err: _Errors) -> None:
    """Raise a ``PolicyError`` for the first thing wrong with ``decisions`` (module doc)."""
    if not isinstance(decisions, Decisions):
        raise err("return", f"returned {_show(decisions)}, not engine.core.context.Decisions")
    views = {v.job_id: v for v in ctx.jobs}
    grids = _mapping(decisions.grids, "grids", err)
    types = set(ctx.cluster.gpus_by_type())
    for jid, grid in grids.items():
        if jid not in views:
            raise err("grids", f"decided for job {_show(jid)}, which is not one of the {len(views)} job(s) of the "
                               "round (unknown, finished, backing off after a failure or outside the queue window)")
        _check_grid(grid, jid, types, err)
    for jid, plan in _mapping(decisions.plans, "plans", err).items():
        _check_plan(plan, jid, grids, err)
    _check_pins(_mapping(decisions.placements, "placements", err), grids, ctx, err)
    if not isinstance(decisions.stats, DecisionStats):
        raise err("stats", f"stats is {_show(decisions.stats)}, not engine.core.context.DecisionStats")
    if decisions.fallbacks is not None and not callable(getattr(decisions.fallbacks, "smaller", None)):
        raise err("fallbacks", f"fallbacks is {_show(decisions.fallbacks)}, which has no smaller(job_id, grid)")
    if decisions.refine is not None and not callable(getattr(decisions.refine, "without", None)):
        raise err("refine", f"refine is {_show(decisions.refine)}, which has no without(failed)")


def _mapping(value: Any, field: str, err: _Errors) -> Mapping:
    if not isinstance(value, Mapping):
        raise err(field, f"{field} is {_show(value)}, not a mapping of job ids")
    return value


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_grid(grid: Any, jid: str, types: set[str], err: _Errors) -> None:
    if not isinstance(grid, Grid):
        raise err("grids", f"the grid of job {_show(jid)} is {_show(grid)}, not instances.grid.Grid")
    s = getattr(grid, "shape", None)
    if not (isinstance(s, Shape) and isinstance(getattr(s, "gpu_type", None), str)
            and _whole(getattr(s, "num_nodes", None)) and _whole(getattr(s, "gpus_per_node", None))
            and _whole(getattr(grid, "pp", None))):
        raise err("grids", f"the grid of job {_show(jid)} is malformed: {_show(grid)}")
    if s.gpu_type not in types:
        raise err("grids", f"the grid of job {_show(jid)} is on GPU type {s.gpu_type!r}, which the cluster lacks "
                           f"(it has {', '.join(sorted(types))})")
    if s.num_nodes < 1 or s.gpus_per_node < 1:
        raise err("grids", f"the grid of job {_show(jid)} has {s.num_nodes} node(s) of {s.gpus_per_node} GPU(s): "
                           "at least one of each")
    if grid.pp < 1 or s.num_gpus % grid.pp:
        raise err("grids", f"the grid of job {_show(jid)} has pipeline depth {grid.pp}, which does not divide its "
                           f"{s.num_gpus} GPUs")


def _check_plan(plan: Any, jid: str, grids: Mapping, err: _Errors) -> None:
    if jid not in grids:
        raise err("plans", f"gives a plan for job {_show(jid)}, which it gives no grid (the job waits)")
    if not isinstance(plan, (Plan, BatchPlan)):
        raise err("plans", f"the plan of job {_show(jid)} is {_show(plan)}, not instances.plan.Plan or BatchPlan")
    grid = grids[jid]
    if isinstance(plan, Plan) and (plan.num_gpus != grid.num_gpus or plan.pp != grid.pp):
        raise err("plans", f"the plan of job {_show(jid)} (pp{plan.pp} x dp{plan.dp} x tp{plan.tp}) does not fit "
                           f"its grid {grid}")


def _check_pins(pins: Mapping, grids: Mapping, ctx: RoundContext, err: _Errors) -> None:
    if not pins:
        return
    nodes = ctx.cluster.nodes()
    taken: dict[tuple[int, int], str] = {}
    for jid, gpus in pins.items():
        if jid not in grids:
            raise err("placements", f"pins GPUs for job {_show(jid)}, which it gives no grid")
        grid = grids[jid]
        if not isinstance(gpus, (tuple, list)) or not all(
                isinstance(g, tuple) and len(g) == 2 and _whole(g[0]) and _whole(g[1]) for g in gpus):
            raise err("placements", f"the pin of job {_show(jid)} is {_show(gpus)}, not a tuple of (node, gpu) "
                                    "integer pairs")
        per_node: dict[int, int] = {}
        for n, i in gpus:
            if not (0 <= n < len(nodes) and 0 <= i < nodes[n].num_gpus):
                raise err("placements", f"the pin of job {_show(jid)} names GPU ({n}, {i}), which the cluster lacks "
                                        f"(nodes 0..{len(nodes) - 1})")
            if nodes[n].gpu_type != grid.gpu_type:
                raise err("placements", f"the pin of job {_show(jid)} names GPU ({n}, {i}), a {nodes[n].gpu_type}, "
                                        f"for its grid of {grid.gpu_type}")
            if n in ctx.unavailable_nodes:
                raise err("placements", f"the pin of job {_show(jid)} names GPU ({n}, {i}), on a node out of service")
            if (n, i) in taken:
                raise err("placements", f"job {_show(jid)} and job {_show(taken[(n, i)])} are both pinned to GPU "
                                        f"({n}, {i})")
            taken[(n, i)] = jid
            per_node[n] = per_node.get(n, 0) + 1
        shape = grid.shape
        if len(per_node) != shape.num_nodes or any(c != shape.gpus_per_node for c in per_node.values()):
            raise err("placements", f"the pin of job {_show(jid)} ({len(gpus)} GPU(s) on {len(per_node)} node(s)) "
                                    f"does not match its grid {grid} ({shape.num_nodes} node(s) x "
                                    f"{shape.gpus_per_node} GPU(s))")
    for v in ctx.jobs:                   # a running job kept in place holds its GPUs
        cur = v.current
        if cur is None or v.job_id in pins or v.job_id not in grids or grids[v.job_id].shape != cur.grid.shape \
                or cur.on_any(ctx.unavailable_nodes):
            continue
        for g in cur.gpus:
            if g in taken:
                raise err("placements", f"job {_show(taken[g])} is pinned to GPU {g}, which job {_show(v.job_id)} "
                                        "keeps (the decision leaves it on its grid, unpinned)")


class CheckedFallbacks:
    """A policy's fallbacks whose answers are checked as the round's placement takes them."""

    def __init__(self, inner: Any, err: _Errors):
        self.inner, self.err = inner, err

    def smaller(self, job_id: str, than: Grid) -> tuple[Grid, JobPlan | None] | None:
        try:
            alt = self.inner.smaller(job_id, than)
        except Exception as e:
            raise _raised(self.err, e, f"fallbacks.smaller: {type(e).__name__}: {e}", "fallbacks") from e
        if alt is None:
            return None
        if not (isinstance(alt, tuple) and len(alt) == 2):
            raise self.err("fallbacks", f"fallbacks.smaller({_show(job_id)}) returned {_show(alt)}, not (grid, plan) "
                                        "or None")
        grid, plan = alt
        _check_grid(grid, job_id, set(self.err.ctx.cluster.gpus_by_type()), self.err)
        if not isinstance(grid, Grid) or grid.num_gpus >= than.num_gpus:
            raise self.err("fallbacks", f"fallbacks.smaller({_show(job_id)}) returned {grid}, not smaller than {than}")
        if plan is not None:
            _check_plan(plan, job_id, {job_id: grid}, self.err)
        return grid, plan


class CheckedRefine:
    """A policy's refinements (``Decisions.refine``), each new decision checked as the
    first was."""

    def __init__(self, inner: Any, ctx: RoundContext, err: _Errors):
        self.inner, self.ctx, self.err = inner, ctx, err

    def without(self, failed: Mapping[str, Grid]) -> Decisions:
        try:
            decisions = self.inner.without(failed)
        except Exception as e:
            raise _raised(self.err, e, f"refine.without: {type(e).__name__}: {e}", "refine") from e
        return checked(decisions, self.ctx, self.err)


def _show(v: Any) -> str:
    """A value as a message shows it, cut short."""
    try:
        text = repr(v)
    except Exception:                    # a repr that raises is no reason for a traceback
        text = f"<{type(v).__name__}>"
    return text if len(text) <= 120 else text[:100] + f"... ({type(v).__name__})"
