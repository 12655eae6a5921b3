"""``--perf-runtime``: the training runtime the policies' estimates assume (the estimator
defaults, or the Arena artifact's, under which its measured table was taken); the
baselines' data-parallel twin assumes the same one."""
from __future__ import annotations

import pytest

from engine.cli.main import main
from estimators.config import EstimatorConfig, arena_runtime
from estimators.perf import DpOnlyTwin, make_default_model
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job


def test_the_arena_runtime_reaches_the_model_and_its_baseline_twin():
    job = Job("j", "gpt__1.3B", 256, 10, 0.0)
    grid = Grid(Shape("a100-40gb", 1, 8), 1)
    arena, default = arena_runtime(), EstimatorConfig()
    for kind in ("analytic", "table"):
        model = make_default_model(kind, runtime="arena")
        base = model if kind == "analytic" else model.analytic
        assert model.runtime == "arena" and base.cfg.efficiency == arena.efficiency
        assert base.cfg.memory == arena.memory and base.cfg.planner == arena.planner
        twin = DpOnlyTwin()(model)
        tb = twin if kind == "analytic" else twin.analytic
        assert twin.dp_only and tb.cfg.efficiency == arena.efficiency and tb.cfg.memory == arena.memory
        plain = make_default_model(kind)
        assert plain.runtime == "default"
        assert (plain if kind == "analytic" else plain.analytic).cfg.efficiency == default.efficiency
    # rematerialisation re-runs the forward: the same plan takes longer under the Arena runtime
    a = make_default_model("analytic", runtime="arena").estimate(job, grid)
    d = make_default_model("analytic").estimate(job, grid)
    assert a.iteration_time_s != d.iteration_time_s
    with pytest.raises(InputError) as e:
        make_default_model("analytic", runtime="alpa")
    assert e.value.field == "runtime"


def test_fcfs_without_a_model_refuses_a_runtime_before_any_work(tmp_path, capsys):
    assert main(["simulate", "--instance", "demo", "--perf-runtime", "arena", "--out", str(tmp_path / "o")]) == 2
    assert "field '--perf-runtime'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_simulations_estimate_for_the_runtime_their_truth_was_measured_under(tmp_path, capsys):
    # every table oracle is the Arena table (or its extrapolation): its runtime is the Arena
    # artifact's, and a policy decides for it unless --perf-runtime says otherwise
    import json

    from engine.cli.common import build_perf
    from instances.builtin import get_instance
    from instances.oracle import make_oracle
    assert get_instance("demo").oracle.training_runtime == "arena"
    assert make_oracle("arena-rule").training_runtime == "arena"
    for given, want in ((None, "arena"), ("default", "default"), ("arena", "arena")):
        out = tmp_path / f"o-{given}"
        argv = ["simulate", "--instance", "demo", "--policy", "arena", "--rounds", "3", "--no-plots", "--quiet",
                "--out", str(out)] + (["--perf-runtime", given] if given else [])
        assert main(argv) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["perf"], summary["perf_runtime"]) == ("analytic", want)
    capsys.readouterr()
    # the service's jobs run on this project's launcher: its runtime
    assert build_perf(None, "arena").runtime == "default"
    assert build_perf(None, "arena", truth_runtime="arena").runtime == "arena"


def test_a_learned_artifact_passed_over_for_another_runtime_is_named(tmp_path, monkeypatch, capsys):
    # the saved artifact is fitted for the default runtime: a simulation deciding for the
    # Arena runtime fits afresh, and says so (the fit itself is tested with the learned model;
    # here it is replaced to keep the test fast)
    import estimators.perf as perf
    from engine.cli.common import build_perf
    art = tmp_path / "learned.joblib"
    art.write_bytes(b"")
    monkeypatch.setenv("ARENA_LEARNED_ARTIFACT", str(art))
    seen = []
    monkeypatch.setattr(perf, "make_default_model", lambda kind, **kw: seen.append((kind, kw["runtime"])))
    build_perf("learned", "arena", truth_runtime="arena")
    assert seen == [("learned", "arena")] and str(art) in capsys.readouterr().err
    build_perf("learned", "arena", runtime="default", truth_runtime="arena")
    assert seen[-1] == ("learned", "default") and capsys.readouterr().err == ""
