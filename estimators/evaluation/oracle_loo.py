"""Leave-one-out accuracy of the truth oracle's extrapolation rules.

For every row of the measured table (instances/data/arena/measured_iter_times.csv):
hide it, rebuild the oracle from the other rows, and predict the hidden key. Feasible
rows give an absolute percentage error; out-of-memory rows test the feasibility rule.
Compares our rule (instances.oracle.TableOracle) with the Arena artifact's rule
(instances.oracle.ArenaRuleOracle). The cap (300 s) is lifted during the evaluation so
that a too-slow prediction still counts as a (bad) prediction.

Run:  .venv/bin/python bench/bench_oracle.py [--json out.json]
(or ``python -m estimators.evaluation.oracle_loo``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from instances.grid import Shape
from instances.measurements import load_measured_iter_times
from instances.oracle import ArenaRuleOracle, OracleConfig, TableOracle

RULES = {"ours": TableOracle, "arena": ArenaRuleOracle}


def leave_one_out(rule: str, config: OracleConfig | None = None) -> dict:
    rows = load_measured_iter_times()
    cfg = config or OracleConfig(max_iteration_time_s=1e9)
    apes, missing, oom_right, oom_total, feasible_called_oom = [], 0, 0, 0, 0
    per_row = []
    for i, row in enumerate(rows):
        oracle = RULES[rule](rows[:i] + rows[i + 1:], cfg)
        shape = Shape(row.gpu_type, row.num_nodes, row.gpus_per_node)
        pred = oracle.iteration_time(row.model, row.global_batch, shape)
        if row.iter_time_s is None:
            oom_total += 1
            oom_right += pred is None
        elif pred is None:
            missing += 1
            feasible_called_oom += 1
        else:
            apes.append(abs(pred - row.iter_time_s) / row.iter_time_s)
        per_row.append({"key": list(row.key), "measured_s": row.iter_time_s, "predicted_s": pred})
    n_feasible = sum(r.iter_time_s is not None for r in rows)
    return {
        "rule": rule,
        "feasible_rows": n_feasible,
        "predicted_rows": len(apes),
        "coverage": len(apes) / n_feasible,
        "mape": statistics.fmean(apes) if apes else float("nan"),
        "median_ape": statistics.median(apes) if apes else float("nan"),
        "p90_ape": sorted(apes)[int(0.9 * (len(apes) - 1))] if apes else float("nan"),
        "oom_rows": oom_total,
        "oom_rows_predicted_infeasible": oom_right,
        "per_row": per_row,
    }


def leave_one_type_out(config: OracleConfig | None = None) -> dict:
    """Hide every row of one GPU type and predict them with our rule, which must then
    transfer from the other types through the catalog's spec ratio (as for H100, L20...)."""
    rows = load_measured_iter_times()
    cfg = config or OracleConfig(max_iteration_time_s=1e9)
    out = {}
    for gpu in sorted({r.gpu_type for r in rows}):
        oracle = TableOracle([r for r in rows if r.gpu_type != gpu], cfg)
        apes, signed = [], []
        for r in rows:
            if r.gpu_type != gpu or r.iter_time_s is None:
                continue
            pred = oracle.iteration_time(r.model, r.global_batch, Shape(gpu, r.num_nodes, r.gpus_per_node))
            if pred is not None:
                apes.append(abs(pred - r.iter_time_s) / r.iter_time_s)
                signed.append(pred / r.iter_time_s)
        out[gpu] = {"rows": len(apes), "mape": statistics.fmean(apes),
                    "median_ratio": statistics.median(signed)}
    return out


def common_mape(a: dict, b: dict) -> tuple[int, float, float]:
    """MAPE of both rules over the rows that both predict."""
    ea, eb = [], []
    for ra, rb in zip(a["per_row"], b["per_row"]):
        m = ra["measured_s"]
        if m is not None and ra["predicted_s"] is not None and rb["predicted_s"] is not None:
            ea.append(abs(ra["predicted_s"] - m) / m)
            eb.append(abs(rb["predicted_s"] - m) / m)
    return len(ea), statistics.fmean(ea), statistics.fmean(eb)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the full results (per row) to this file")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results = {name: leave_one_out(name) for name in RULES}
    elapsed = time.perf_counter() - t0
    print(f"leave-one-out over {results['ours']['feasible_rows']} feasible + "
          f"{results['ours']['oom_rows']} out-of-memory measured rows ({elapsed:.1f} s)")
    print(f"{'rule':8} {'coverage':>9} {'MAPE':>7} {'median':>7} {'p90':>7} {'OOM kept':>9}")
    for name, r in results.items():
        print(f"{name:8} {r['coverage']:9.1%} {r['mape']:7.1%} {r['median_ape']:7.1%} {r['p90_ape']:7.1%} "
              f"{r['oom_rows_predicted_infeasible']:>4}/{r['oom_rows']}")
    n, ours, arena = common_mape(results["ours"], results["arena"])
    print(f"on the {n} rows both rules predict: MAPE ours {ours:.1%}, arena {arena:.1%}")
    print("leave-one-GPU-type-out (ours; transfer by spec ratio; the Arena rule cannot predict these):")
    lot = leave_one_type_out()
    for gpu, r in lot.items():
        print(f"  {gpu:10} rows {r['rows']:3}  MAPE {r['mape']:6.1%}  "
              f"median predicted/measured {r['median_ratio']:.2f}")
    results["leave_one_type_out"] = lot
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
