"""Round latency of the solver backends at the three target sizes (a benchmark, not a test).

    .venv/bin/python bench/bench_solver.py [--backend auto --backend highs ...] [--repeat 6] [--out FILE]

Sizes: 1,280 GPUs / 500 active jobs, 2,048 / 1,000 and 10,240 / 4,000 (synthetic rounds
of Arena's shape, consecutive rounds sharing 95% of their jobs). Writes one JSON list
of rows (see ``engine.cli.commands.bench.solver.solver_bench``) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys

from engine.cli.commands.bench.solver import solver_bench

SIZES = ((1280, 500, 0.1), (2048, 1000, 0.25), (10240, 4000, 2.0))     # GPUs, jobs, target median s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", action="append")
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    backends = args.backend or ["auto", "lagrangian", "highs-lp", "highs"]
    rows = []
    for gpus, jobs, target in SIZES:
        print(f"{gpus} GPUs / {jobs} jobs (target median {target} s)", file=sys.stderr, flush=True)
        for r in solver_bench(gpus, jobs, backends, args.repeat, args.time_limit, 0.01):
            r["target_median_s"] = target
            rows.append(r)
            print(f"  {r['backend']:<11} cold {r['cold_latency_s']:.3f} s  median {r['median_latency_s']:.3f} s  "
                  f"p99 {r['p99_latency_s']:.3f} s  max gap {r['max_gap']:.4f}  {r['statuses']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
