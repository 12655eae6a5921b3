"""``arena``: our policy. Every job's candidate grids across GPU types, counts, node
shapes and pipeline depths, valued by the estimators' proxy-plan estimates (ctx.perf),
one MILP per round over jobs x grids (engine/decide/formulation), solved by the configured
backend (default ``auto``: warm Lagrangian prices, escalating to LP rounding and the
HiGHS MILP until the 1% gap is proved).

What it knows: on fixed-batch jobs, each job's remaining work (the ``jct`` term reads
remaining iterations: clairvoyant) and the estimators' throughput estimates (never the
truth); on the Sia artifact's goodput jobs (the ``GOODPUT`` preset below), no job's length
(the ``utility`` term with ``weight=none``; ``utility.weight=remaining`` makes it
clairvoyant) and the goodput of every configuration from the profiles (true throughput
and statistical efficiency, as ``sia``'s default ``estimates=profiles``).

Objective (weights are config, ``w_<term>=...``; options ``<term>.<option>=...``):
normalized throughput + JCT weights (short remaining work first) + a bonus per job run
(the queue penalty, aging with waiting time) - the reconfiguration penalty (work lost
while a moved job is down, priced by the shared ReconfigCostModel), which is also what
favours previous allocations; a move that makes a job slower to make room for others is
charged 3x its loss in normalized throughput once more (``reconfig.give_way=3``; 0
turns it off). Other terms (fairness, deadline, quota) are off by
default and switched on by a positive weight.
"""
from __future__ import annotations

import dataclasses

from .milp import MilpPolicySpec, Preset, register_milp_policy

# On the Sia artifact's goodput jobs (module doc): the bounded utility of normalized goodput,
# moves kept over the job's age, no stability rule, node-shape rows that count what running
# jobs hold (on newTrace's two most loaded workloads 1.09 and 1.00 h against 1.13 and 1.07 h
# without; docs/results/2026-12-06-decisions-that-win.md); knows no job's length.
GOODPUT = Preset(weights={"utility": 1.0}, options={"utility.p": -0.5, "utility.bonus": 1.1,
                                                    "utility.move_horizon": "age"},
                 runner={"stability": False, "held_rows": True})

# ``reconfig.give_way=3`` (module doc), measured in docs/engine.md, "Giving way judged for
# the whole cluster": 22-29% fewer reconfigurations on philly and overloaded at the same
# average JCT.
ARENA = MilpPolicySpec(name="arena", weights={"throughput": 1.0, "jct": 1.0, "queue": 1.0, "reconfig": 1.0},
                       options={"reconfig.give_way": 3.0}, goodput_preset=GOODPUT)
register_milp_policy(ARENA)

# ``arena-incremental``: arena's objective, decided by the incremental expand/balance
# search from the current allocation (the same as ``arena`` with ``search=incremental``;
# registered so that a benchmark row can name it).
register_milp_policy(dataclasses.replace(ARENA, name="arena-incremental", searches=("incremental", "milp")))
