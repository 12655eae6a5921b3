"""``gavel`` baseline (Narayanan et al., OSDI'20), as the Arena comparison configured it:
heterogeneity-aware, each job keeps the GPU count its user asked for (any GPU type),
data-parallel-only estimates with a data-parallel memory check.

What it knows: no job's length (least attained service); data-parallel-only estimates.

What it simplifies: Gavel solves an LP for time fractions per (job, GPU type) that
maximize the minimum normalized throughput, then realizes them with round-based
priorities. Here each round is the MILP over (job, type) at the requested count with
normalized throughput weighted by least attained service (``las``: jobs that got less
so far come first, which is how the rounds realize max-min shares over time), a bonus
per job run, and the same reconfiguration cost as every policy. No space sharing.

On the Sia artifact's goodput jobs (``sia:`` instances) both decide as Sia's comparison
ran Gavel: engine/decide/policies/gavel_goodput.py (its LP, time-sharing rounds of 360 s, the
workload's GPU counts and batches). The artifact's profiles hold only data-parallel
runs, so there ``gavel-ap`` is ``gavel``.
"""
from __future__ import annotations

import dataclasses

from engine.core.context import JobView
from instances.grid import Grid

from .gavel_goodput import OPTIONS as GOODPUT_OPTIONS
from .gavel_goodput import GavelGoodput
from .milp import MilpPolicySpec, register_milp_policy


def keeps_requested_count(view: JobView, grid: Grid) -> bool:
    want = view.job.requested_gpus
    return want is None or grid.num_gpus == want


GAVEL = MilpPolicySpec(name="gavel", weights={"las": 1.0, "queue": 1.0, "reconfig": 1.0}, dp_only=True,
                       grid_filter=keeps_requested_count, goodput=GavelGoodput, goodput_options=GOODPUT_OPTIONS)
register_milp_policy(GAVEL)
# ``gavel-ap``: the same policy, each job run with the planner's best plan (node shape,
# pipeline depth, tensor/data split) for the GPU type and count gavel chose, from the
# same estimates as arena: adaptive parallelism without co-designed placement.
register_milp_policy(dataclasses.replace(GAVEL, name="gavel-ap", dp_only=False, best_plan_per_count=True))
