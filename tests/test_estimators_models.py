"""PerformanceModel kinds, the factory, dp_only, caching, the learned model's splits and artifact."""
import math

import pytest

from estimators import make_performance_model
from estimators.analytic import AnalyticModel
from estimators.base import PerformanceModel
from estimators.learned import (
    ARTIFACT_VERSION,
    AUTO_CANDIDATES,
    LearnedModel,
    cv_folds,
    pick_correction,
    record_model,
    records_from_table,
    select_scores,
)
from estimators.reference import load_measured
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job

JOB = Job("j", "gpt__760M", 128, 10, 0.0)


@pytest.fixture(scope="module")
def records():
    rows = load_measured()
    return records_from_table(rows, AnalyticModel())


def test_factory_kinds_and_protocol():
    for kind in ("analytic", "table"):
        m = make_performance_model(kind)
        assert isinstance(m, PerformanceModel)
    with pytest.raises(InputError):
        make_performance_model("nope")
    with pytest.raises(InputError):
        make_performance_model("analytic", efficiency={"memory_bw_efficiency": 2.0})


def test_analytic_estimate_and_cache():
    m = make_performance_model("analytic")
    g = Grid(Shape("a100-40gb", 1, 4), 1)
    e = m.estimate(JOB, g)
    assert e.feasible and e.plan.num_gpus == 4
    assert e.throughput == pytest.approx(128 / e.iteration_time_s)
    assert "roofline-transfer" in e.source
    assert m.estimate(JOB, g) is e                       # cached
    loaded = m.estimate(JOB, Grid(Shape("a100-40gb", 2, 2), 1), link_load=2.0)
    assert loaded.iteration_time_s > m.estimate(JOB, Grid(Shape("a100-40gb", 2, 2), 1)).iteration_time_s


def test_dp_only_restricts_plans():
    m = make_performance_model("analytic", dp_only=True)
    e = m.estimate(JOB, Grid(Shape("a100-40gb", 1, 4), 1))
    assert e.plan.tp == 1 and e.plan.pp == 1 and e.plan.dp == 4
    assert not m.estimate(JOB, Grid(Shape("a100-40gb", 1, 4), 2)).feasible
    big = Job("b", "gpt__6.7B", 128, 1, 0.0)         # 6.7B x 16 B = 107 GB: no single A100 holds it
    assert not m.estimate(big, Grid(Shape("a100-40gb", 1, 4), 1)).feasible
    assert make_performance_model("analytic").estimate(big, Grid(Shape("a100-40gb", 1, 8), 4)).feasible


def test_table_exact_rows_and_fallback():
    rows = [r for r in load_measured() if r.iter_time_s is not None]
    r = rows[0]
    m = make_performance_model("table")
    job = Job("t", r.model, r.global_batch, 1, 0.0)
    e = m.estimate(job, Grid(Shape(r.gpu_type, r.num_nodes, r.gpus_per_node), 1))
    assert e.iteration_time_s == r.iter_time_s and e.source.startswith("table/measured")
    miss = m.estimate(job, Grid(Shape("h100-sxm", 1, 8), 1))
    assert "fallback" in miss.source
    none = make_performance_model("table", fallback=None).estimate(job, Grid(Shape("h100-sxm", 1, 8), 1))
    assert not none.feasible and math.isinf(none.iteration_time_s)


def test_learned_fit_predict_save_load_update(records, tmp_path):
    train = [r for r in records if r.group != "a10"]
    test = [r for r in records if r.group == "a10"]
    m = LearnedModel(train_on=None, correction="squared_error").fit(train)
    assert m.chosen == "squared_error" and m.selection == {}
    pred = m.predict_records(test)
    assert len(pred) == len(test) and all(p > 0 for p in pred)
    # trained on three types, it must beat a constant-zero correction on its training rows
    import numpy as np
    fit_err = np.mean(np.abs(m.predict_records(train) / [r.measured_s for r in train] - 1))
    base_err = np.mean([abs(r.analytic_s / r.measured_s - 1) for r in train])
    assert fit_err < base_err
    path = m.save(tmp_path / "learned.joblib")
    m2 = LearnedModel.load(path)
    assert np.allclose(m2.predict_records(test), pred)
    g = Grid(Shape("a40", 1, 2), 1)
    e = m2.estimate(JOB, g)
    assert e.feasible and e.source.startswith("learned/") and any("learned correction" in n for n in e.notes)
    assert m2.chosen == "squared_error"
    import joblib
    blob = joblib.load(path)
    blob["artifact_version"] = ARTIFACT_VERSION + 1
    joblib.dump(blob, tmp_path / "bad.joblib")
    with pytest.raises(InputError):
        LearnedModel.load(tmp_path / "bad.joblib")
    run = {"kind": "measured_run", "model": "tiny-gpt__2L", "device": "cpu", "gpu_type": "cpu", "dp": 2, "tp": 1,
           "pp": 1, "microbatches": 1, "schedule": "1f1b", "global_batch": 8, "num_nodes": 1,
           "gpus_per_node": 2, "iteration_time_s": 0.05, "step": 3, "timestamp": 1.0}
    n = len(m2.records)
    m2.update([run])
    assert len(m2.records) == n + 1 and m2.records[-1].group == "cpu"


def test_cli_estimate_grids(capsys):
    import json as _json

    from engine.cli.main import main
    assert main(["estimate", "--model", "gpt__760M", "--gpu-type", "a40", "--gpus", "4", "--batch", "128",
                 "--json"]) == 0
    out = _json.loads(capsys.readouterr().out)
    assert out["gpu_type"] == "a40" and out["grids"]
    assert all(g["grid"].startswith("a40:") for g in out["grids"])
    assert any(g["feasible"] and g["plan"]["dp"] * g["plan"]["tp"] * g["plan"]["pp"] == 4 for g in out["grids"])
    assert main(["estimate", "--model", "gpt__760M", "--gpu-type", "a40"]) == 2      # --gpus missing
    assert main(["estimate", "--model", "nope__1B", "--gpu-type", "a40", "--gpus", "2"]) == 2


def test_cv_folds_hold_out_what_they_name(records):
    n = len(records)
    for by in ("row", "model", "gpu_type"):
        folds = list(cv_folds(records, by, seed=3))
        tests = [i for _, test in folds for i in test]
        assert sorted(tests) == list(range(n))                  # every record tested exactly once
        for train, test in folds:
            assert not set(train) & set(test) and len(train) + len(test) == n
            if by != "row":
                key = (lambda r: r.group) if by == "gpu_type" else record_model
                assert not {key(records[i]) for i in train} & {key(records[i]) for i in test}
    held_types = [{records[i].group for i in test} for _, test in cv_folds(records, "gpu_type")]
    assert sorted(min(t) for t in held_types) == ["a10", "a100-40gb", "a40", "v100-32gb"]
    assert all(len(t) == 1 for t in held_types)                     # one GPU type per fold
    assert len({r.row_id for r in records}) == len(records)         # row ids are unique
    assert len(list(cv_folds(records, "model"))) == 5
    with pytest.raises(InputError):
        list(cv_folds(records, "nope"))


def test_auto_correction_is_chosen_on_training_rows_only(records, monkeypatch):
    import estimators.learned as learned
    train = [r for r in records if r.group != "a10"]
    seen = []
    real = learned.select_scores

    def spy(recs, params, by, *, seed=0):
        seen.append({r.row_id for r in recs})
        return real(recs, params, by, seed=seed)

    monkeypatch.setattr(learned, "select_scores", spy)
    m = LearnedModel(train_on=None, select_by="gpu_type", n_estimators=30).fit(train)
    assert seen == [{r.row_id for r in train}]
    assert set(m.selection) == set(AUTO_CANDIDATES) and m.chosen == min(m.selection, key=m.selection.get)
    if m.chosen == "none":                                      # the analytic estimate unchanged
        test = [r for r in records if r.group == "a10"]
        assert list(m.predict_records(test)) == [r.analytic_s for r in test]
    # the "none" candidate's cross-validated error is the analytic model's own error
    sel, _ = select_scores(train, dict(n_estimators=10, max_depth=2, learning_rate=0.1, subsample=0.8,
                                       random_state=0), "row")
    assert sel["none"] == pytest.approx(sum(abs(r.analytic_s / r.measured_s - 1) for r in train) / len(train))
    for bad in ({"correction": "nope"}, {"select_by": "nope"}, {"select_metric": "nope"}):
        with pytest.raises(InputError):
            LearnedModel(train_on=None, **bad)
    # the same inner cross-validation scores the grid choice; select_metric="choice" keeps its best
    assert set(m.choice_selection) == set(AUTO_CANDIDATES)
    by_choice = LearnedModel(train_on=None, select_by="gpu_type", n_estimators=30, select_metric="choice").fit(train)
    assert by_choice.choice_selection == m.choice_selection
    assert by_choice.chosen == pick_correction(m.selection, m.choice_selection, "choice")
    assert by_choice.choice_selection[by_choice.chosen] == max(m.choice_selection.values())


def test_pick_correction_by_error_or_by_grid_choice():
    mape = {"none": 0.13, "squared_error": 0.11, "absolute_error": 0.10}
    choice = {"none": 0.99, "squared_error": 0.97, "absolute_error": 0.99}
    assert pick_correction(mape, choice, "error") == "absolute_error"
    assert pick_correction(mape, choice, "choice") == "absolute_error"        # tie on choice: lower error
    assert pick_correction(mape, dict(choice, none=0.995), "choice") == "none"
    assert pick_correction(mape, {c: None for c in mape}, "choice") == "absolute_error"   # no groups: error
