"""The shadow policy (engine/core/shadow.py): asked every round on the same context as the
policy that decides, compared job by job, never carried out — a simulation's results
are the same with and without it; a shadow that raises is recorded, not propagated."""
from __future__ import annotations

import csv
import math

import pytest

from engine.cli.main import main as cli_main
from engine.core.context import Decisions
from engine.core.policy import make_policy
from engine.core.reconfig import ReconfigCostModel
from engine.core.shadow import COLUMNS, compare
from engine.sim.metrics import TIMING_KEYS
from engine.sim.simulator import simulate
from estimators.base import Estimate
from tests.test_engine_helpers import Inst, LinearOracle, ScriptedPolicy, cluster, grid, job
from tests.test_engine_simulator import _grow_when_alone


class LinearPerf:
    """Estimated iteration time = 10 s / GPUs (what LinearOracle's truth is)."""
    name = "linear"

    def estimate(self, job, g):
        t = 10.0 / g.num_gpus
        return Estimate(t, job.global_batch / t, 0.0, None)


def _never_grow(ctx):
    """As ``_grow_when_alone`` but A stays on 1x2."""
    return {v.job_id: v.current.grid if v.current else grid("a100", 1, 2) for v in ctx.jobs}


def hand_instance():
    return Inst("hand", cluster(("a100", 1, 4)), (job("A", 0.0, 1000), job("B", 10.0, 100)), LinearOracle(10.0))


def test_a_shadow_that_differs_in_one_round_is_counted_exactly_and_changes_nothing(tmp_path):
    # the hand-computed run of test_engine_simulator: B runs rounds 1-2 (300-820 s); at
    # round 3 (900 s) A is alone and the primary grows it 1x2 -> 1x4, the shadow keeps it
    plain = simulate(hand_instance(), ScriptedPolicy(_grow_when_alone), rounds=20, reconfig=ReconfigCostModel(),
                     perf=LinearPerf())
    res = simulate(hand_instance(), ScriptedPolicy(_grow_when_alone), rounds=20, reconfig=ReconfigCostModel(),
                   perf=LinearPerf(), shadow=ScriptedPolicy(_never_grow, name="never-grow"))
    strip = lambda s: {k: v for k, v in s.items() if k not in TIMING_KEYS and not k.startswith("shadow_")}
    assert strip(res.summary) == strip(plain.summary)
    assert [j.finish_s for j in res.jobs] == [j.finish_s for j in plain.jobs] == [pytest.approx(3000.0),
                                                                                 pytest.approx(820.0)]
    compared = {r.index: r.shadow for r in res.rounds if r.shadow is not None}
    assert sorted(compared) == list(range(10))       # A ends at 3000 s: rounds 0-9 have a job to compare
    differ = {i: c for i, c in compared.items() if not c.all_agree}
    assert list(differ) == [3]
    c = differ[3]
    assert (c.jobs, c.agree, c.disagreements) == (1, 0, 1)
    assert [(d.job_id, d.current, d.primary, d.shadow) for d in c.differ] == [
        ("A", "a100-40gb:1x2:pp1", "a100-40gb:1x4:pp1", "a100-40gb:1x2:pp1")]
    assert c.changes == (1, 0) and c.gpus == (4, 2) and c.running == (1, 1)
    assert c.rate_ratio == pytest.approx(0.5)        # the shadow's grid: half the estimated rate
    s = res.summary
    assert s["shadow_policy"] == "never-grow" and s["shadow_rounds"] == 10 and s["shadow_rounds_all_agree"] == 9
    assert s["shadow_rounds_failed"] == 0 and s["shadow_changes_primary"] == 1 and s["shadow_changes_shadow"] == 0
    # job-rounds: A in rounds 0-9, B in rounds 1-2 (it ends at 820 s): 12, one of them differs
    assert s["shadow_job_agreement"] == pytest.approx(11 / 12)
    assert s["shadow_rate_ratio_geomean"] == pytest.approx(0.5)
    from engine.sim.plots import SHADOW_PLOT, write_plots
    assert SHADOW_PLOT in [p.name for p in write_plots(res, tmp_path / "with")]
    assert SHADOW_PLOT not in [p.name for p in write_plots(plain, tmp_path / "without")]


def test_compare_counts_waits_stops_and_agreements():
    inst = hand_instance()
    seen = []
    simulate(inst, ScriptedPolicy(_grow_when_alone, seen=seen), rounds=2, reconfig=ReconfigCostModel())
    ctx = seen[1]                                     # round 1: A running on 1x2, B queued
    primary = Decisions({"A": grid("a100", 1, 2), "B": grid("a100", 1, 2)})
    stop_a = Decisions({"B": grid("a100", 1, 4)})     # A stopped, B on another grid
    c = compare(ctx, primary, stop_a, policy="x", decision_time_s=0.0)
    assert (c.jobs, c.agree, c.disagreements) == (2, 0, 2)
    assert c.changes == (0, 1) and c.running == (2, 1) and c.gpus == (4, 4)
    assert c.rate_ratio is None                      # no performance model in this context
    assert {d.job_id: d.shadow for d in c.differ} == {"A": None, "B": "a100-40gb:1x4:pp1"}
    same = compare(ctx, primary, Decisions(dict(primary.grids)), policy="x", decision_time_s=0.0)
    assert same.all_agree and same.agree == 2 and same.differ == ()
    assert set(same.row()) == set(COLUMNS) - {"round", "time_s"}


class Broken:
    name = "broken"

    def decide(self, ctx):
        raise RuntimeError("no solver today")


def test_a_shadow_that_raises_is_recorded_and_the_round_goes_on():
    plain = simulate(hand_instance(), ScriptedPolicy(_grow_when_alone), rounds=20, reconfig=ReconfigCostModel())
    res = simulate(hand_instance(), ScriptedPolicy(_grow_when_alone), rounds=20, reconfig=ReconfigCostModel(),
                   shadow=Broken())
    assert [j.finish_s for j in res.jobs] == [j.finish_s for j in plain.jobs]
    errors = {r.shadow.error for r in res.rounds if r.shadow is not None}
    assert errors == {"RuntimeError: no solver today"}
    s = res.summary
    assert s["shadow_rounds"] == s["shadow_rounds_failed"] == 10 and s["shadow_rounds_all_agree"] == 0
    assert math.isnan(s["shadow_job_agreement"])


def test_the_same_policy_as_its_own_shadow_agrees_every_round():
    from estimators.perf import make_default_model
    from instances.builtin import get_instance
    inst = get_instance("demo", 0)
    res = simulate(inst, make_policy("sia-ap"), perf=make_default_model("analytic"), rounds=30,
                   shadow=make_policy("sia-ap"))
    comps = [r.shadow for r in res.rounds if r.shadow is not None]
    assert len(comps) == 30 and all(c.all_agree for c in comps)
    assert res.summary["shadow_job_agreement"] == 1.0


def test_cli_writes_shadow_csv_and_refuses_bad_shadow_options(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(["simulate", "--instance", "demo", "--policy", "fcfs", "--shadow-policy", "sia-ap",
                     "--rounds", "12", "--out", str(out), "--no-plots", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "shadow_policy" in text and "sia-ap" in text
    with (out / "shadow.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS and rows
    assert all(r["error"] == "" for r in rows), "the shadow got no performance model beside fcfs"
    assert all(int(r["agree"]) + int(r["disagreements"]) == int(r["jobs"]) for r in rows)
    assert any(int(r["disagreements"]) > 0 for r in rows)
    assert not (tmp_path / "plain").exists()
    assert cli_main(["simulate", "--instance", "demo", "--rounds", "2", "--out", str(tmp_path / "plain"),
                     "--no-plots", "--quiet"]) == 0
    assert not (tmp_path / "plain" / "shadow.csv").exists()
    capsys.readouterr()
    assert cli_main(["simulate", "--instance", "demo", "--shadow-policy", "nope", "--rounds", "2",
                     "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--shadow-policy" in err and "nope" in err and "Traceback" not in err
    assert cli_main(["simulate", "--instance", "demo", "--shadow-policy-opt", "a=1", "--rounds", "2",
                     "--out", str(tmp_path / "x")]) == 2
    assert "--shadow-policy-opt" in capsys.readouterr().err
    assert cli_main(["simulate", "--instance", "demo", "--shadow-policy", "sia-ap", "--shadow-policy-opt",
                     "bogus=1", "--rounds", "2", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--shadow-policy-opt" in err and "bogus" in err
    assert not (tmp_path / "x").exists()
