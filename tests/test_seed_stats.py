"""Policies over several seeds (engine/sim/seed_stats.py, ``arena bench policies --seeds``):
the spread and the paired JCT ratio by hand, as properties, and end to end."""
from __future__ import annotations

import csv
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cli.main import main
from engine.sim.seed_stats import aggregate, paired_ratio, parse_seeds, seeds_changed_nothing, spread


def row(policy, seed, jct, unfinished=0, makespan=100.0):
    return {"policy": policy, "policy_name": policy, "seed": seed, "avg_jct_runout_s": jct,
            "makespan_runout_s": makespan, "jobs_unfinished_runout": unfinished, "jobs_never_placed": unfinished}


def test_parse_seeds():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("3, 1,7-8") == [3, 1, 7, 8]
    for bad, match in [("2-1", "low-high"), ("a", "like 0-4"), ("1,1", "twice"), ("-1", "like 0-4"),
                       ("0-20000", "at most")]:
        with pytest.raises(ValueError, match=match):
            parse_seeds(bad)


def test_spread_and_the_paired_ratio_by_hand():
    s = spread([1.0, 3.0, None, float("nan")])
    assert s == {"mean": 2.0, "sd": math.sqrt(2.0), "min": 1.0, "max": 3.0, "n": 2}
    assert spread([])["mean"] is None and spread([5.0])["sd"] == 0.0
    # baseline 200 and 300 against the policy's 100 and 100: ratios 2 and 3
    g = paired_ratio([(row("b", 0, 200.0), row("p", 0, 100.0)), (row("b", 1, 300.0), row("p", 1, 100.0))])
    assert g["geomean"] == pytest.approx(math.sqrt(6.0)) and g["wins"] == 2 and g["seeds_compared"] == 2
    half = 12.7062047 * (math.log(3) - math.log(2)) / math.sqrt(2) / math.sqrt(2)   # t(0.975, 1 df)
    m = (math.log(2) + math.log(3)) / 2
    assert g["ci95"] == pytest.approx([math.exp(m - half), math.exp(m + half)], rel=1e-6)
    # a seed where either left a job unfinished is not compared (its average is over fewer jobs)
    g = paired_ratio([(row("b", 0, 200.0), row("p", 0, 100.0, unfinished=1)), (row("b", 1, 300.0), row("p", 1, 100.0))])
    assert (g["seeds_compared"], g["seeds_incomparable"], g["geomean"], g["ci95"]) == (1, 1, pytest.approx(3.0), None)
    g = paired_ratio([(row("b", 0, 200.0, unfinished=2), row("p", 0, 100.0))])
    assert g["geomean"] is None and g["seeds_incomparable"] == 1


def test_aggregate_keeps_the_order_and_checks_the_baseline():
    rows = [row("a", 0, 100.0), row("b", 0, 150.0), row("a", 1, 120.0), row("b", 1, 120.0, unfinished=3)]
    agg = aggregate(rows, "b")
    assert [e["policy"] for e in agg] == ["a", "b"]
    assert agg[0]["avg_jct_runout_s"]["mean"] == 110.0 and agg[1]["jobs_unfinished_runout_total"] == 3
    assert agg[0]["jct_gain_vs_baseline"]["geomean"] == pytest.approx(1.5)       # seed 1 not comparable
    assert agg[1]["jct_gain_vs_baseline"]["geomean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="baseline 'c'"):
        aggregate(rows, "c")
    assert not seeds_changed_nothing(rows)
    assert seeds_changed_nothing([row("a", 0, 1.0), row("a", 1, 1.0)])


jcts = st.floats(min_value=1.0, max_value=1e6, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(jcts, jcts), min_size=1, max_size=12))
def test_the_paired_ratio_is_symmetric_and_its_interval_holds_it(pairs):
    fwd = paired_ratio([(row("b", i, b), row("p", i, p)) for i, (b, p) in enumerate(pairs)])
    back = paired_ratio([(row("p", i, p), row("b", i, b)) for i, (b, p) in enumerate(pairs)])
    assert fwd["geomean"] * back["geomean"] == pytest.approx(1.0)
    assert fwd["min"] <= fwd["geomean"] * (1 + 1e-9) and fwd["geomean"] <= fwd["max"] * (1 + 1e-9)
    if fwd["ci95"] is not None:
        lo, hi = fwd["ci95"]
        assert lo <= fwd["geomean"] * (1 + 1e-9) and fwd["geomean"] <= hi * (1 + 1e-9)


def test_bench_policies_over_seeds_end_to_end(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["bench", "policies", "--instance", "demo", "--policy", "fcfs", "--policy", "gavel-ap",
                 "--seeds", "0-1", "--quiet", "--json", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)                    # --json: pure JSON on stdout
    assert doc["seeds"] == [0, 1] and doc["baseline"] == "fcfs" and not doc["seeds_changed_nothing"]
    assert [(r["policy"], r["seed"]) for r in doc["rows"]] == [("fcfs", 0), ("gavel-ap", 0), ("fcfs", 1),
                                                               ("gavel-ap", 1)]
    gavel = doc["aggregate"][1]
    # gavel-ap leaves two jobs of seed 0 unplaced: that seed is not compared, seed 1 is
    assert gavel["jobs_never_placed_total"] == 2 and gavel["jct_gain_vs_baseline"]["seeds_incomparable"] == 1
    by = {(r["policy"], r["seed"]): r for r in doc["rows"]}
    want = by[("fcfs", 1)]["avg_jct_runout_s"] / by[("gavel-ap", 1)]["avg_jct_runout_s"]
    assert gavel["jct_gain_vs_baseline"]["geomean"] == pytest.approx(want)
    for name in ("results.json", "results.csv", "aggregate.csv", "comparison.png", "seed-0/fcfs/summary.json",
                 "seed-1/gavel-ap/jobs.csv"):
        assert (out / name).is_file(), name
    assert len(list(csv.DictReader((out / "aggregate.csv").open()))) == 2
    # a seed of the sweep is the same run as that seed alone
    assert main(["bench", "policies", "--instance", "demo", "--policy", "fcfs", "--seed", "1", "--quiet",
                 "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)[0]
    assert alone["avg_jct_runout_s"] == by[("fcfs", 1)]["avg_jct_runout_s"]
    assert alone["makespan_runout_s"] == by[("fcfs", 1)]["makespan_runout_s"]


def test_seed_options_are_checked_before_any_run(capsys):
    base = ["bench", "policies", "--instance", "demo", "--policy", "fcfs"]
    assert main(base + ["--seeds", "0-x"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(base + ["--seeds", "0-1", "--baseline", "sia"]) == 2
    assert "not a benchmarked policy label" in capsys.readouterr().err
    assert main(base + ["--baseline", "fcfs"]) == 2
    assert "--baseline needs --seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--seeds", "0-1", "--seed", "3"])
