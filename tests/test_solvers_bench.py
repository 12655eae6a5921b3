"""`arena bench solver` on small synthetic rounds."""
from __future__ import annotations

import json

from engine.cli.commands.bench.solver import solver_bench
from engine.cli.main import main


def test_solver_bench_rows_are_checked_and_proved():
    rows = solver_bench(128, 40, ["auto", "highs", "greedy", "pulp-scip"], repeat=3, time_limit_s=10.0,
                        rel_gap=0.01)
    by = {r["backend"]: r for r in rows}
    assert by["auto"]["rounds"] == 3 and by["auto"]["max_gap"] <= 0.01
    assert by["highs"]["statuses"] == {"optimal": 3}
    assert by["greedy"]["max_gap"] == float("inf")          # greedy proves nothing
    # the optimum bounds every heuristic (same rounds)
    assert by["greedy"]["objective_mean"] <= by["highs"]["objective_mean"] + 1e-6
    if by["pulp-scip"]["rounds"] == 0:
        assert "SCIP" in by["pulp-scip"]["note"]


def test_solver_bench_cli_json(capsys):
    assert main(["bench", "solver", "--gpus", "64", "--jobs", "10", "--repeat", "2",
                 "--backend", "lagrangian", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["backend"] == "lagrangian" and rows[0]["rounds"] == 2
