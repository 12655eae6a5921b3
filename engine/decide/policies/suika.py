"""``suika``: our reconstruction of the second seed system (its paper text is not
available to us; built from the description in issue 11, choices stated here).

What it knows: as ``arena`` on fixed-batch jobs (the ``jct`` term: each job's remaining
work; the estimators' throughput); it has no goodput preset, so on goodput jobs too.

What we know of it: it re-schedules running data x tensor x pipeline jobs
incrementally (most of the cluster stays put), with a topology-aware ordering, an
*expand* step and a *balance* step, in polynomial time, and moves job state device to
device. What we chose:

- **search**: always the incremental search (``engine/decide/incremental``): from the current
  allocation, a running job may take its current grid or a neighbour (x2 / /2 GPUs of
  its type, another node shape or GPU type at its GPU count, with the planner's best
  pipeline depth for each shape); a queued job any of its grids. *Expand* admits and
  grows jobs by marginal gain net of move cost; *balance* moves GPUs from low to high
  marginal gain when the gain beats both jobs' move costs. The topology order (the
  job's own GPUs, then the fullest node that fits, then the same switch) is the
  engine's placement preference, applied to the search's decision.
- **objective** (weights 1 each): normalized throughput + JCT weights (its headline
  metric is average JCT) + the queue bonus - the reconfiguration penalty, with the
  move cost amortized over ``reconfig.horizon_rounds=4`` rounds (a device-to-device
  move is cheap, and a move that pays off within four rounds is made) and a fixed
  damping of ``reconfig.per_move=0.1`` rounds of the job's reference throughput per
  move (estimates are not truth).
- **move budget**: at most 25% of the running jobs and 25% of the cluster's GPUs move
  per round (``move_budget_jobs``, ``move_budget_gpus``).
- decides from ``ctx.perf`` like ``arena`` (its performance learning from running jobs
  is the estimators' job here).

Every option of the optimizing runner applies (``w_<term>``, ``<term>.<option>``,
``queued_candidates``, ``other_type_candidates``, the budgets); ``search=milp`` is refused.
"""
from __future__ import annotations

from .milp import MilpPolicySpec, register_milp_policy

SUIKA = MilpPolicySpec(name="suika", weights={"throughput": 1.0, "jct": 1.0, "queue": 1.0, "reconfig": 1.0},
                       options={"reconfig.horizon_rounds": 4.0, "reconfig.per_move": 0.1},
                       searches=("incremental",),
                       runner={"move_budget_jobs": 0.25, "move_budget_gpus": 0.25})
register_milp_policy(SUIKA)
