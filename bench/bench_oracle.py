"""Leave-one-out accuracy of the truth oracle's extrapolation rules: a thin entry point
to ``estimators.evaluation.oracle_loo`` (where the evaluation lives).

Run:  .venv/bin/python bench/bench_oracle.py [--json out.json]
"""
import sys

from estimators.evaluation.oracle_loo import main

if __name__ == "__main__":
    sys.exit(main())
