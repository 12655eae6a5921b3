"""A shadow policy: a second policy asked every round on the same ``RoundContext`` as
the policy that decides, whose decisions are compared and recorded, never carried out.

What it is for: an operator who considers switching the live service to another policy
(or a researcher who wants to know where two policies part ways) sees, round by round on
the real trajectory, which jobs the other policy would have placed differently, how many
running jobs it would have moved or stopped, and what the shared performance model
expects of each choice — without giving it the cluster. Both policies read the same
context; policies are pure functions of it, so the shadow cannot change what runs (a
test holds a simulation's results identical with and without a shadow).

What the comparison is, and is not: an agreement count and the performance model's
view of both decisions on *this* round's state. It is not the JCT the shadow policy
would have achieved: after the first disagreement the two policies would have led the
cluster to different states, and only the primary's is observed. For that, replay a
workload under each policy (``arena simulate``, ``arena bench policies``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from instances.grid import Grid

from .context import Decisions, RoundContext
from .decision_check import PolicyError, decide
from .policy import Policy

MAX_LISTED = 50      # disagreements listed per round (all are counted)


@dataclass(frozen=True)
class JobDiff:
    """A job on which the two policies disagree (grids as text; None: it waits)."""
    job_id: str
    current: str | None
    primary: str | None
    shadow: str | None

    def to_dict(self) -> dict:
        return {"job": self.job_id, "current": self.current, "primary": self.primary, "shadow": self.shadow}


@dataclass(frozen=True)
class ShadowComparison:
    """One round: the primary's and the shadow's decisions on the same context.

    ``agree``: jobs given the same grid by both, or left waiting by both (the same grid
    is not the same GPUs: placement maps grids to GPUs afterwards). ``running``, ``gpus``,
    ``changes`` (running jobs moved to another grid or stopped) are pairs (primary,
    shadow). ``rate_ratio``: over the jobs both run, on different grids, the geometric mean
    of the shadow's estimated iteration rate over the primary's (the performance model the
    primary decides with; None when there is no such job or no model). ``error``: the
    shadow raised (its decision is then empty and nothing else is compared)."""
    policy: str
    jobs: int
    agree: int
    differ: tuple[JobDiff, ...]          # the first MAX_LISTED disagreements
    disagreements: int
    running: tuple[int, int]
    gpus: tuple[int, int]
    changes: tuple[int, int]
    rate_ratio: float | None
    decision_time_s: float
    error: str | None = None

    @property
    def all_agree(self) -> bool:
        return self.error is None and self.disagreements == 0

    def to_dict(self) -> dict:
        return {"policy": self.policy, "jobs": self.jobs, "agree": self.agree,
                "disagreements": self.disagreements, "all_agree": self.all_agree,
                "differ": [d.to_dict() for d in self.differ], "running": list(self.running),
                "gpus": list(self.gpus), "changes": list(self.changes), "rate_ratio": self.rate_ratio,
                "decision_time_s": self.decision_time_s, "error": self.error}

    def row(self) -> dict:
        """The flat record of ``shadow.csv``."""
        return {"shadow_policy": self.policy, "jobs": self.jobs, "agree": self.agree,
                "disagreements": self.disagreements, "running_primary": self.running[0],
                "running_shadow": self.running[1], "gpus_primary": self.gpus[0], "gpus_shadow": self.gpus[1],
                "changes_primary": self.changes[0], "changes_shadow": self.changes[1],
                "rate_ratio": self.rate_ratio, "decision_time_s": self.decision_time_s, "error": self.error or ""}


COLUMNS = ("round", "time_s", "shadow_policy", "jobs", "agree", "disagreements", "running_primary",
           "running_shadow", "gpus_primary", "gpus_shadow", "changes_primary", "changes_shadow", "rate_ratio",
           "decision_time_s", "error")


def compare(ctx: RoundContext, primary: Decisions, shadow: Decisions, *, policy: str,
            decision_time_s: float) -> ShadowComparison:
    """The two decisions on ``ctx``, job by job (see ``ShadowComparison``)."""
    agree, diffs = 0, []
    running, gpus, changes = [0, 0], [0, 0], [0, 0]
    log_ratios = []
    for v in ctx.jobs:
        cur = v.current.grid if v.current is not None else None
        picks: tuple[Grid | None, Grid | None] = (primary.grids.get(v.job_id), shadow.grids.get(v.job_id))
        for side, g in enumerate(picks):
            if g is not None:
                running[side] += 1
                gpus[side] += g.num_gpus
            if cur is not None and g != cur:
                changes[side] += 1
        p, s = picks
        if p == s:
            agree += 1
            continue
        diffs.append(JobDiff(v.job_id, _text(cur), _text(p), _text(s)))
        if p is not None and s is not None and ctx.perf is not None:
            ep, es = ctx.perf.estimate(v.job, p), ctx.perf.estimate(v.job, s)
            if ep.feasible and es.feasible and ep.iteration_time_s > 0 and es.iteration_time_s > 0:
                log_ratios.append(math.log(ep.iteration_time_s / es.iteration_time_s))
    ratio = math.exp(sum(log_ratios) / len(log_ratios)) if log_ratios else None
    return ShadowComparison(policy, len(ctx.jobs), agree, tuple(diffs[:MAX_LISTED]), len(diffs),
                            (running[0], running[1]), (gpus[0], gpus[1]), (changes[0], changes[1]), ratio,
                            decision_time_s)


def _text(g: Grid | None) -> str | None:
    return None if g is None else str(g)


class Shadow:
    """A policy asked beside the primary (``observe``); it never raises into the round:
    an exception of the shadow is recorded as the round's ``error``."""

    def __init__(self, policy: Policy, settle: Callable[[Decisions], Decisions] | None = None):
        self.policy = policy
        self.name: str = policy.name
        # the round's placement, step 1 (engine/core/round_placement.py), so that a shadow
        # that hands fallbacks is compared on the grids it would run, as the primary is
        self.settle = settle

    def observe(self, ctx: RoundContext, primary: Decisions) -> ShadowComparison:
        t0 = time.perf_counter()
        try:
            decisions = decide(self.policy, ctx)        # checked as the primary's are
            if self.settle is not None:
                decisions = self.settle(decisions)
        except Exception as e:           # the shadow must not stop the primary's round
            cause = e.__cause__ if isinstance(e, PolicyError) and e.__cause__ is not None else e   # what it raised
            return ShadowComparison(self.name, len(ctx.jobs), 0, (), 0, (0, 0), (0, 0), (0, 0), None,
                                    time.perf_counter() - t0, error=f"{type(cause).__name__}: {cause}"[:500])
        return compare(ctx, primary, decisions, policy=self.name, decision_time_s=time.perf_counter() - t0)


def counts_line(policy: str, c: dict) -> str:
    """One line for a shadow policy's counts over many rounds (``Store.rounds.shadow_counts``)."""
    share = f"{1 - c['disagreeing'] / c['jobs']:.1%}" if c["jobs"] else "n/a"
    return (f"shadow policy {policy}: asked in {c['rounds']} rounds ({c['failed']} failed); every job's grid the "
            f"same in {c['agreeing']}; same grid for {share} of {c['jobs']} job-rounds")


def summarize(rounds: list[Any]) -> dict:
    """Summary keys over the rounds with a comparison (``rounds``: objects with a
    ``shadow`` attribute, ``RoundRecord``s): empty when there is none."""
    comps = [r.shadow for r in rounds if getattr(r, "shadow", None) is not None]
    if not comps:
        return {}
    ok = [c for c in comps if c.error is None]
    jobs = sum(c.jobs for c in ok)
    ratios = [c.rate_ratio for c in ok if c.rate_ratio is not None]
    times = sorted(c.decision_time_s for c in comps)
    return {
        "shadow_policy": comps[0].policy,
        "shadow_rounds": len(comps),
        "shadow_rounds_failed": len(comps) - len(ok),
        "shadow_rounds_all_agree": sum(1 for c in ok if c.all_agree),
        "shadow_job_agreement": (sum(c.agree for c in ok) / jobs) if jobs else math.nan,
        "shadow_changes_primary": sum(c.changes[0] for c in ok),
        "shadow_changes_shadow": sum(c.changes[1] for c in ok),
        "shadow_rate_ratio_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else math.nan,
        "shadow_decision_time_median_s": times[len(times) // 2],
    }
