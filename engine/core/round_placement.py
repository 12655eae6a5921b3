"""The round's placement, in one place: from a policy's ``Decisions`` to GPUs.

``RoundLoop.round`` runs it in this order, once a round:

1. ``take_fallbacks``: the chosen grids are placed. When some do not fit and the policy
   can decide again (``Decisions.refine``: the optimizing policies, whose model's rows
   count GPUs per type and node shape but not which nodes running jobs keep, nor that a
   multi-node job needs distinct nodes), it is asked to, without the columns that did
   not fit (and those of earlier refinements), until its decision fits or it will not
   refine it further (``refine`` None: the policy's own limit), at most ``MAX_REFINES``
   times: the new optimum is over every job, so others may take the room. Then, when
   the policy handed ranked alternatives (``Decisions.fallbacks``), a job whose grid
   still does not fit takes its best smaller alternative, else it waits; up to
   ``MAX_FALLBACK_ROUNDS`` times, then what still does not fit waits. The GPUs found
   are pinned. What the live service records and a shadow policy is compared with is
   this decision.
2. The loop's truth check (``Executor.runs_on``) drops decisions on shapes the job cannot
   run on; a running job whose move was dropped is requested at the grid it holds.
3. ``place_requests``: the requests are placed with the decision's pins
   (``Placer.place``, engine/core/placement.py). Failures are split into the decision's
   own (packing failures) and those only a dropped move caused (displaced: the dropped
   mover kept GPUs another job was placed on); a running job whose new grid did not fit
   keeps its GPUs when they are still free.

A policy that decides by fitting jobs itself (``fcfs``, the goodput baselines) uses the
same ``Placer`` for its fit tests and pins what it fitted; step 3 then finds every pin
free and only checks it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from instances.allocation import Allocation
from instances.grid import Grid

from .context import Decisions
from .placement import Placer

MAX_FALLBACK_ROUNDS = 4          # rounds of "take the fallbacks of the jobs that did not fit, place again"
MAX_REFINES = 64                 # most times a round a policy is asked to decide again (its own limit ends it
                                 # first: a decision it will not refine has ``refine`` None)


def refine(placer: Placer, decisions: Decisions, current: Mapping[str, Allocation],
           unavailable: frozenset[int]) -> Decisions:
    """``decisions``, or the policy's decision again without the columns placement could
    not map (``Decisions.refine``), until it fits or the policy stops refining, at most
    ``MAX_REFINES`` times; the count and the columns cut in ``stats.placement_refines``
    and ``stats.columns_cut``."""
    if decisions.refine is None:
        return decisions
    refines = cut = 0
    for _ in range(MAX_REFINES):
        pins = {j: g for j, g in decisions.placements.items() if j in decisions.grids}
        failed = placer.place(decisions.grids, current, pins, unavailable).failed
        if not failed or decisions.refine is None:
            break
        cut += len(failed)
        decisions = decisions.refine.without({jid: decisions.grids[jid] for jid in failed})
        refines += 1
    if not refines:
        return decisions
    return replace(decisions, stats=replace(decisions.stats, placement_refines=refines, columns_cut=cut))


def take_fallbacks(placer: Placer, decisions: Decisions, current: Mapping[str, Allocation],
                   unavailable: frozenset[int]) -> Decisions:
    """``decisions`` with every grid placeable (step 1 above): the grids that do not fit
    replaced by the policy's fallbacks or left out, the GPUs found pinned, and the
    counts in ``stats.placement_repairs`` and ``stats.placement_dropped`` (and in
    ``stats.placement_fallbacks`` the grid first chosen for each job given a fallback);
    the policy is first asked to decide again (``refine``) where it can. Decisions without
    fallbacks come back as they are (refined)."""
    decisions = refine(placer, decisions, current, unavailable)
    fallbacks = decisions.fallbacks
    if fallbacks is None:
        return decisions
    grids: dict[str, Grid] = dict(decisions.grids)
    plans = dict(decisions.plans)
    pins = dict(decisions.placements)     # a policy's pins are kept, not replaced (checked: decision_check.py)
    repairs, dropped = 0, []
    first: dict[str, str] = {}                  # job -> the grid the policy chose, for those given a fallback
    for _ in range(MAX_FALLBACK_ROUNDS):
        res = placer.place(grids, current, {j: g for j, g in pins.items() if j in grids}, unavailable)
        if not res.failed:
            break
        for jid in res.failed:
            grid = grids.pop(jid)
            plans.pop(jid, None)
            alt = fallbacks.smaller(jid, grid)
            if alt is None:
                dropped.append(jid)
                continue
            first.setdefault(jid, str(grid))
            grids[jid] = alt[0]          # (re-inserted: it is placed after the others next time)
            if alt[1] is not None:
                plans[jid] = alt[1]
            repairs += 1
    else:
        res = placer.place(grids, current, {j: g for j, g in pins.items() if j in grids}, unavailable)
        for jid in res.failed:
            grids.pop(jid, None)
            plans.pop(jid, None)
            dropped.append(jid)
        res = placer.place(grids, current, {j: g for j, g in pins.items() if j in grids}, unavailable)
    placements = {jid: a.gpus for jid, a in res.allocations.items()}
    stats = replace(decisions.stats, placement_repairs=repairs, placement_dropped=tuple(dropped),
                    placement_fallbacks={j: g for j, g in first.items() if j in grids})
    return Decisions(grids=grids, placements=placements, plans=plans, stats=stats)


@dataclass(frozen=True)
class RoundPlacement:
    """Step 3's result: what each job runs on this round (absent: it waits or stops)."""
    allocations: Mapping[str, Allocation]
    packing_failures: frozenset[str]     # the decision's own grids that did not fit
    displaced: int                       # jobs left waiting only because a dropped move kept its GPUs
    repaired: int                        # failures the placer's own repair step fixed


def place_requests(placer: Placer, requests: Mapping[str, Grid], dropped: Mapping[str, Grid],
                   pins: Mapping, current: Mapping[str, Allocation], unavailable: frozenset[int],
                   leaving: set[str]) -> RoundPlacement:
    """Step 3 above. ``requests``: the truth-checked grid of each job to run; ``dropped``:
    running jobs whose decided move was dropped at the truth check (requested at their
    current grid), with the grid decided; ``pins``: the decision's ``placements``;
    ``leaving``: running jobs that must leave their GPUs (their node left service)."""
    pinned = {j: g for j, g in pins.items() if j in requests and j not in dropped}
    res = placer.place(requests, current, pinned, unavailable)
    failed = set(res.failed)
    if dropped and failed:
        # which failures are the decision's own: place it as decided (dropped moves included)
        as_decided = placer.place({**requests, **dropped}, current, {j: g for j, g in pins.items() if j in requests},
                                  unavailable)
        own = failed & set(as_decided.failed)
    else:
        own = failed
    allocs = dict(res.allocations)
    # a running job whose new grid did not fit stays where it is, if its GPUs are still free
    stuck = [j for j in res.failed if j in current and j not in leaving]
    if stuck:
        taken = {g for a in allocs.values() for g in a.gpus}
        for jid in stuck:
            if taken.isdisjoint(current[jid].gpus):
                allocs[jid] = current[jid]
                taken.update(current[jid].gpus)
    return RoundPlacement(allocs, frozenset(own), len(failed - own), res.repaired)
