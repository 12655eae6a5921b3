"""`arena bench`: solver and policy benchmarks.

- ``arena bench solver --gpus G --jobs J [--backend B ...] [--repeat R] [--json]``: a
  sequence of R synthetic rounds (consecutive rounds share 95% of their jobs, as real
  rounds do), each built into the MILP and solved by every backend; per backend the
  round latency (model build + solve: cold first round, then median and p99), the
  objective, the proved gap and the statuses.
- ``arena bench incremental --gpus G --jobs J --rounds R [--json]``: the incremental
  search's quality yardstick (``engine/decide/incremental/yardstick.py``): a sequence of
  synthetic rounds, each starting from the previous round's allocation; per round the
  incremental search's objective as a fraction of the full MILP's (same ``c @ x``) and
  both decision times.
- ``arena bench policies (--instance NAME | --cluster FILE --trace FILE) [--policy P ...]
  [--reconfig-opt preset=realistic] [--perf KIND] [--json] [--out DIR]``: every policy on
  the same workload, truth oracle and reconfiguration cost model, side by side, run out
  (every job judged), plus one PNG figure. Policies decide from estimates (the default
  performance model) unless ``--perf table`` asks for the published comparison's mode.
  ``--policy LABEL=NAME`` runs a variant of policy NAME (its options from
  ``--policy-opt LABEL:KEY=VALUE``) as its own row, e.g. an objective beside the default.
  Under ``mpiexec -n K`` the policies are spread over the ranks and rank 0 gathers the
  rows.
- ``arena bench bound (--instance NAME | --cluster FILE --trace FILE) [RUN_DIR ...]``:
  each job's JCT alone on the cluster at its fastest shape (``instances/bounds.py``), and
  the given runs' average JCT against it, split by job length (``engine/cli/commands/bench/bound.py``).
"""
from __future__ import annotations

from . import bound, incremental, policies, solver


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark solver backends and policies",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    solver.register(sub)
    incremental.register(sub)
    policies.register(sub)
    bound.register(sub)
