"""``--perf-runtime``: the training runtime the policies' estimates assume (the estimator
defaults, or the Arena artifact's, under which its measured table was taken); the
baselines' data-parallel twin assumes the same one."""
from __future__ import annotations

import pytest

from engine.cli import main
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
