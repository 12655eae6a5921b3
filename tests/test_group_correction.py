"""The learned model's ``group`` correction: the most specific group with enough rows, shrunk."""
import numpy as np
import pytest

from estimators.analytic import AnalyticModel
from estimators.group_correction import LEVELS, GroupMedianCorrection
from estimators.learned import FEATURES, LearnedModel, record_model, records_from_table
from estimators.reference import load_measured

IDX = {f: i for i, f in enumerate(FEATURES)}
A100 = dict(log_peak_flops=1.0, log_mem_bw=2.0, log_intra_bw=3.0, log_inter_bw=4.0, gpu_mem_gib=40.0, pcie=0.0)
V100 = dict(A100, log_peak_flops=0.5, gpu_mem_gib=32.0)


def row(family: str, gpu: dict, nodes: int, per_node: int) -> np.ndarray:
    x = np.zeros(len(FEATURES))
    x[IDX[f"fam_{family}"]] = 1.0
    for k, v in gpu.items():
        x[IDX[k]] = v
    x[IDX["num_nodes"]], x[IDX["gpus_per_node"]], x[IDX["num_gpus"]] = nodes, per_node, nodes * per_node
    return x


def test_most_specific_group_with_enough_rows_wins_shrunk():
    X = [row("gpt", A100, 1, 4), row("gpt", A100, 1, 4), row("gpt", A100, 1, 4),    # family, type, shape
         row("gpt", A100, 2, 2),                                                   # same count, one row
         row("moe", V100, 1, 8), row("moe", V100, 1, 8)]
    y = [0.3, 0.1, 0.2, -0.5, -0.4, -0.2]
    g = GroupMedianCorrection(FEATURES).fit(X, y)
    p = g.predict([row("gpt", A100, 1, 4),       # level 1: median 0.2 of 3 rows, x 3/5
                   row("gpt", A100, 2, 2),       # level 1 has one row: level 2 (gpt, A100, 4 GPUs), 4 rows
                   row("gpt", V100, 4, 1),       # level 3 (gpt, 4 GPUs): the same 4 rows
                   row("moe", A100, 1, 8),       # level 4 (A100, 1x8) has none: level 5 (moe), 2 rows
                   row("wide_resnet", V100, 2, 8)])   # no group with 2 rows: unchanged
    med4 = float(np.median([0.3, 0.1, 0.2, -0.5]))
    assert p == pytest.approx([0.2 * 3 / 5, med4 * 4 / 6, med4 * 4 / 6, -0.3 * 2 / 4, 0.0])
    # without shrinkage the group's median itself; a higher minimum skips small groups
    assert GroupMedianCorrection(FEATURES, shrink=0).fit(X, y).predict([row("gpt", A100, 1, 4)]) == \
        pytest.approx([0.2])
    assert GroupMedianCorrection(FEATURES, min_rows=4).fit(X, y).predict([row("gpt", A100, 1, 4)]) == \
        pytest.approx([med4 * 4 / 6])
    assert len(LEVELS) == 5


def test_bad_configuration_and_unfitted_use_are_errors():
    with pytest.raises(ValueError):
        GroupMedianCorrection(FEATURES, min_rows=0)
    with pytest.raises(ValueError):
        GroupMedianCorrection(FEATURES, shrink=-1.0)
    with pytest.raises(ValueError, match="lack"):
        GroupMedianCorrection(("num_gpus", "fam_gpt"))
    with pytest.raises(ValueError, match="fit it first"):
        GroupMedianCorrection(FEATURES).predict([row("gpt", A100, 1, 1)])


def test_learned_model_with_the_group_correction_on_held_out_models(tmp_path):
    records = records_from_table(load_measured(), AnalyticModel())
    errs, base = [], []
    for held in sorted({record_model(r) for r in records}):       # leave one model out
        train = [r for r in records if record_model(r) != held]
        test = [r for r in records if record_model(r) == held]
        m = LearnedModel(train_on=None, correction="group").fit(train)
        pred = m.predict_records(test)
        assert m.chosen == "group" and np.all(np.isfinite(pred)) and np.all(pred > 0)
        errs += list(np.abs(pred / [r.measured_s for r in test] - 1))
        base += [abs(r.analytic_s / r.measured_s - 1) for r in test]
    # the other models' group medians carry over to a model none of the rows came from
    assert np.mean(errs) < np.mean(base)
    assert np.allclose(LearnedModel.load(m.save(tmp_path / "g.joblib")).predict_records(test), pred)
