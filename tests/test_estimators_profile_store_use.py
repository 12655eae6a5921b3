"""A profile store that `arena profile` filled, read by the performance models the
policies decide with (`--profile-store` on simulate, serve, bench policies and estimate), the baselines'
data-parallel-only twin included; bad stores are refused before any work."""
from __future__ import annotations

import pytest

from engine.cli.main import main
from estimators.perf import DpOnlyTwin, make_default_model, open_profile_store
from estimators.profile_store import LayerProfile, ProfileStore
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job
from instances.models import get_model

ARCH = get_model("tiny-gpt__4L")
JOB = Job("j", "tiny-gpt__4L", 8, 10, 0.0)
GRID = Grid(Shape("cpu", 1, 2), 1)


def _store(path) -> ProfileStore:
    """Every layer of the model on ``cpu`` at 1 ms forward, 2 ms backward (fast, made up)."""
    store = ProfileStore(path)
    store.put_layers([LayerProfile("cpu", "float32", s.kind, tuple(s.signature), tp, mb, 1e-3, 2e-3, 1e12, 1e12,
                                   "full", 1e-3, 2e-3, 1.0, 1, 3e-3)
                      for s in {(s.kind, tuple(s.signature)): s for s in ARCH.layers()}.values()
                      for tp in (1, 2) for mb in (1, 2, 4, 8)])
    return store


@pytest.mark.parametrize("kind", ["analytic", "table", "online"])
def test_each_kind_and_its_dp_only_twin_read_the_store(tmp_path, kind):
    store = _store(tmp_path)
    catalog = make_default_model(kind).estimate(JOB, GRID)
    model = make_default_model(kind, profile_store=str(tmp_path))
    e = model.estimate(JOB, GRID)
    assert "profiled" in e.source and "profiled" not in catalog.source
    assert e.iteration_time_s != pytest.approx(catalog.iteration_time_s)
    twin = DpOnlyTwin()(model)
    t = twin.estimate(JOB, GRID)
    assert "profiled" in t.source and t.plan.tp == 1 and t.plan.pp == 1
    assert open_profile_store(store) is store


def test_missing_or_empty_stores_are_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(InputError) as e:
        open_profile_store(tmp_path)                      # a folder, but nothing profiled in it
    assert e.value.field == "profile_store" and "arena profile" in str(e.value)
    missing = str(tmp_path / "none")
    for argv in (["simulate", "--instance", "demo", "--policy", "arena", "--profile-store", missing,
                  "--out", str(tmp_path / "o")],
                 ["simulate", "--instance", "demo", "--profile-store", str(tmp_path)],       # fcfs reads none
                 ["estimate", "--model", "tiny-gpt__4L", "--gpu-type", "cpu", "--gpus", "2", "--profile-store",
                  missing],
                 ["estimate", "accuracy", "--profile-store", missing],                   # grids only
                 ["bench", "policies", "--instance", "demo", "--profile-store", missing]):
        assert main(argv) == 2, argv
        assert "field '--profile-store'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_estimate_grids_with_a_store(tmp_path, capsys):
    _store(tmp_path)
    assert main(["estimate", "--model", "tiny-gpt__4L", "--gpu-type", "cpu", "--gpus", "2", "--gpus-per-node", "2",
                 "--batch", "8", "--profile-store", str(tmp_path), "--json"]) == 0
    import json
    rows = json.loads(capsys.readouterr().out)
    rows = rows["grids"] if isinstance(rows, dict) else rows
    assert rows and all("profiled" in r["source"] for r in rows)
