"""The stability rule: which running jobs an optimizing policy may not move this round.

A move costs the moved job its downtime (and, live, the start-up of every rank), so a
policy that re-optimizes every round from estimates moves jobs back and forth for gains
that never pay for the move. Every optimizing policy (``arena``, ``suika``, ``sia``,
``gavel``, ``elasticflow-ls``, their ``-ap`` variants) applies the same rule, with the
same defaults, so comparisons stay fair. A running job is *frozen* — it keeps exactly
its current grid and GPUs, and is not preempted — while any of these holds:

1. **its last change has not paid for itself** (``payback``). At its last change of
   allocation (a start, a resume or a move) at time ``t_c`` the job had been running at
   ``r_b`` iterations/s (measured; 0 when it came from the queue). The change has paid
   for itself once the progress made since, ``p``, is at least what staying would have
   made, ``p >= r_b x (now - t_c)``, and at least one iteration (so a launch still
   starting up — 5-10 s of interpreter and torch start-up live — is never moved again).
   This is measured progress, so the real downtime of the move counts, not its price.
   A change that will never pay for the job itself (it was shrunk to make room for
   others, ``r_new <= r_b``) is held for ``payback_max_s`` (default 3,600 s) instead;
2. **it reached the move limit** (``max_moves_per_hour``, default 1): that many moves or
   preemptions in the last hour (first starts are not counted);
3. **it reached its lifetime limit** (``max_changes_per_job``, default 0 = none): that
   many moves or preemptions since it was submitted. With 1, a job is moved or
   preempted at most once, so it is reconfigured (moved, or resumed after a
   preemption) at most once: the bound on reconfigurations per job made a rule;
4. **its back-off has not run out** (``move_backoff_s``, default 0 = none): after its
   n-th move or preemption a job keeps its allocation for ``move_backoff_s`` x 2^(n-1)
   from its last change, so a job's changes grow with the logarithm of its running
   time instead of linearly.

A fifth part is a budget for the whole cluster rather than a per-job hold:
``change_budget_per_job`` (default 0 = none). Every job that finishes pays that many
changes into a common budget; every move or preemption, of any job, spends one. A round
may change at most ``floor(budget x finished - changes so far)`` running jobs (all of
them are frozen when that is 0), so reconfigurations per job stay at most the budget on
average, while the jobs whose moves gain most — the long ones, usually — get more than
one, and a job shrunk to admit others can still grow back. The budget is paid at
completions, not arrivals, because a completion frees the GPUs that make a move worth
it: paid at arrivals it was spent on the first moves of a busy cluster and none was left
to grow the last long jobs when the cluster emptied (measured on ``arena-philly``, budget
1: average JCT +94% and makespan 2.8x paid at arrivals, against +17% and 0.96x paid at
completions; docs/engine.md). The MILP policies enforce it as one more row of the
round's model (moves of running jobs <= the round's allowance; the incremental search
takes it as its move budget); ``elasticflow-ls``, a greedy, allocates a round that moves
more again, holding every running job but the first allowance of its moves. Preemptions
are not in that row: a round that preempts overdraws the budget by them, and no job changes again
until completions have paid it back, so the average holds over the run, not every instant.

Hysteresis on marginal gains, the remaining part of stability, is in the objective: the
``reconfig`` term's ``hysteresis`` (default 0.05) charges a move of a running job that
fraction of what its current grid is worth, so a move must beat staying by 5%. Its
``give_way`` (``arena``'s default 3, the baselines' 0) charges a move that makes the job
slower once more that multiple of its loss, so the others' gain must clearly beat it.

``stability=false`` turns the rule off (the behaviour before it existed, for
reproducing published comparisons); ``payback=false`` or ``max_moves_per_hour=0``
turn off one part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from engine.core.context import JobView, RoundContext
from instances.errors import InputError
from instances.limits import MAX_COEFFICIENT, check_time, show_number

HOUR_S = 3600.0

#: policy config keys the rule reads (every optimizing policy accepts them)
STABILITY_KEYS = ("stability", "payback", "payback_max_s", "max_moves_per_hour", "max_changes_per_job",
                  "move_backoff_s", "change_budget_per_job")


def parse_bool(policy: str, key: str, v: Any) -> bool:
    """A policy's boolean option (a bool, or true/false/1/0/yes/no/on/off), else InputError."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return v.strip().lower() in ("true", "1", "yes", "on")
    raise InputError(f"policy {policy!r}: {key} must be true or false, got {v!r}", field=key)


def _number(policy: str, key: str, v: Any, lo: float) -> float:
    """``v`` as a finite number >= ``lo`` and within the bounds on input: a time (``*_s``)
    at most ``MAX_TIME_S``, a count or budget at most ``MAX_COEFFICIENT``."""
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"policy {policy!r}: {key} must be a finite number, got {show_number(v)}",
                         field=key) from None
    if not (math.isfinite(x) and x >= lo):
        raise InputError(f"policy {policy!r}: {key} must be a finite number >= {lo}, got {v!r}", field=key)
    if key.endswith("_s"):
        check_time(x, field=key, what=f"policy {policy!r}: {key} ")
    elif x > MAX_COEFFICIENT:
        raise InputError(f"policy {policy!r}: {key} must be at most {MAX_COEFFICIENT:g}, got {v!r}", field=key)
    return x


@dataclass(frozen=True)
class StabilityRule:
    enabled: bool = True
    payback: bool = True
    payback_max_s: float = HOUR_S
    max_moves_per_hour: int = 1          # 0: no limit
    max_changes_per_job: int = 0         # 0: no limit
    move_backoff_s: float = 0.0          # 0: no back-off
    change_budget_per_job: float = 0.0   # 0: no cluster-wide budget

    @classmethod
    def from_config(cls, policy: str, config: Mapping[str, Any]) -> "StabilityRule":
        """From a policy's config keys (``STABILITY_KEYS``), validated."""
        d = cls()
        counts = {}
        for key in ("max_moves_per_hour", "max_changes_per_job"):
            n = _number(policy, key, config.get(key, getattr(d, key)), 0)
            if n != int(n):
                raise InputError(f"policy {policy!r}: {key} must be a whole number, got {n!r}", field=key)
            counts[key] = int(n)
        return cls(enabled=parse_bool(policy, "stability", config.get("stability", d.enabled)),
                   payback=parse_bool(policy, "payback", config.get("payback", d.payback)),
                   payback_max_s=_number(policy, "payback_max_s", config.get("payback_max_s", d.payback_max_s), 0),
                   move_backoff_s=_number(policy, "move_backoff_s", config.get("move_backoff_s", d.move_backoff_s), 0),
                   change_budget_per_job=_number(policy, "change_budget_per_job",
                                                 config.get("change_budget_per_job", d.change_budget_per_job), 0),
                   **counts)

    def is_frozen(self, view: JobView, now_s: float) -> bool:
        ch = view.last_change
        if not self.enabled or view.current is None or ch is None:
            return False
        if self.max_moves_per_hour and sum(1 for t in ch.recent_s if t > now_s - HOUR_S) >= self.max_moves_per_hour:
            return True
        if self.max_changes_per_job and ch.total >= self.max_changes_per_job:
            return True
        if self.move_backoff_s and ch.total and now_s - ch.changed_at_s < self.move_backoff_s * 2.0 ** (ch.total - 1):
            return True
        if self.payback:
            held = now_s - ch.changed_at_s
            paid = ch.iterations_since >= max(1.0, ch.rate_before * held)
            if not paid and held < self.payback_max_s:
                return True
        return False

    def round_allowance(self, ctx: RoundContext) -> int | None:
        """How many running jobs this round may change under the cluster-wide budget
        (None: no budget). 0 when the budget is spent or overdrawn."""
        if not self.enabled or not self.change_budget_per_job:
            return None
        # the small epsilon keeps 0.5 x 4 jobs = 2 changes exact under floating point
        return max(0, math.floor(self.change_budget_per_job * ctx.finished_jobs - ctx.changes_total + 1e-9))

    def frozen(self, ctx: RoundContext) -> frozenset[str]:
        """The running jobs that keep their allocation this round (all of them when the
        cluster-wide budget allows no change)."""
        if not self.enabled:
            return frozenset()
        if self.round_allowance(ctx) == 0:
            return frozenset(v.job_id for v in ctx.jobs if v.current is not None)
        return frozenset(v.job_id for v in ctx.jobs if self.is_frozen(v, ctx.now_s))
