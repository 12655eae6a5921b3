"""``sia`` baseline (Jayaram Subramanya et al., SOSP'23), as the Arena comparison
configured it: an elastic goodput ILP over GPU types and counts, data-parallel-only
estimates with a data-parallel memory check, and a restart factor that penalises
reallocations.

What it knows: no job's length; data-parallel-only estimates (fixed-batch jobs). On
goodput jobs see sia_goodput.py.

What it simplifies: Sia's goodput couples throughput with statistical efficiency
(batch-size adaptation); the traces fix each job's global batch, so goodput is
throughput here. Its objective sum_j (goodput_j / goodput_j(min config)) is the
``throughput`` term with ``reference="smallest"``; every job that can run gets a
bonus (Sia's ILP schedules every job it can); the restart factor is the
``reconfig`` term with a fixed per-move cost (``reconfig.per_move``, default 0.25 of a
round) on top of the shared cost model's downtime. Sia's bootstrapping profiler is
replaced by the estimator's DP-only estimates.

On the Sia artifact's goodput jobs (``sia:`` instances) both decide as Sia's own
simulator does: engine/decide/policies/sia_goodput.py (goodput with batch adaptation, Sia's p,
lambda_n, restart penalties and bootstrapping). The artifact's profiles hold only
data-parallel runs, so there ``sia-ap`` is ``sia``.
"""
from __future__ import annotations

import dataclasses

from .milp import MilpPolicySpec, register_milp_policy
from .sia_goodput import OPTIONS as GOODPUT_OPTIONS
from .sia_goodput import SiaGoodput

SIA = MilpPolicySpec(name="sia", weights={"throughput": 1.0, "queue": 1.0, "reconfig": 1.0},
                     options={"throughput.reference": "smallest", "reconfig.per_move": 0.25}, dp_only=True,
                     goodput=SiaGoodput, goodput_options=GOODPUT_OPTIONS)
register_milp_policy(SIA)
# ``sia-ap``: the same policy, each job run with the planner's best plan (node shape,
# pipeline depth, tensor/data split) for the GPU type and count sia chose, from the
# same estimates as arena: adaptive parallelism without co-designed placement.
register_milp_policy(dataclasses.replace(SIA, name="sia-ap", dp_only=False, best_plan_per_count=True))
