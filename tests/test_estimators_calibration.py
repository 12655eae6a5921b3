"""Calibration plumbing: fitted parameters, the Arena runtime preset, and the honesty of
the leave-one-GPU-type-out analytic refit (no fit ever sees its test rows)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimators.config import EfficiencyConfig, EstimatorConfig, arena_runtime
from estimators.evaluation import accuracy, calibrate
from estimators.evaluation.calibrate import FIT_PARAMS, NEUTRAL_START, apply_params, neutral_start
from estimators.evaluation.local_accuracy import launcher_runtime
from estimators.learned import CORRECTIONS


def test_apply_params_sets_named_constants_and_clips():
    base = EfficiencyConfig()
    eff = apply_params(base, [math.log(0.3), math.log(5.0)], ("conv", "inter_bw_efficiency"))
    assert eff.compute_efficiency("bottleneck") == eff.compute_efficiency("conv_stem") == pytest.approx(0.3)
    assert eff.inter_bw_efficiency == 1.0                                   # clipped to a fraction
    assert eff.compute_efficiency("decoder") == base.compute_efficiency("decoder")
    with pytest.raises(ValueError):
        apply_params(base, [0.0], ("decoder", "conv"))
    n = neutral_start(base)
    assert n.memory_bw_efficiency == pytest.approx(NEUTRAL_START["memory_bw_efficiency"])
    assert set(NEUTRAL_START) == set(FIT_PARAMS)


def test_arena_runtime_and_launcher_runtime_presets():
    a = arena_runtime()
    assert a.efficiency.recompute_activations and a.efficiency.dp_sharded_optimizer
    assert a.memory.optimizer_for("wide_resnet") == "sgd" and a.memory.optimizer_for("gpt") == "adam"
    d = EstimatorConfig()
    assert a.efficiency.kind_compute_efficiency == d.efficiency.kind_compute_efficiency   # hardware constants shared
    eff, mem = launcher_runtime()
    assert not eff.recompute_activations and not eff.dp_sharded_optimizer
    assert mem.optimizer_for("wide_resnet") == "adam"


def test_leave_one_type_out_refit_never_fits_on_its_test_rows(monkeypatch):
    seen = []

    def fake_fit(rows, base, *, max_evals=80, params=FIT_PARAMS, starts=1):
        seen.append({r.gpu_type for r in rows})
        return base.efficiency

    monkeypatch.setattr(calibrate, "fit_efficiency", fake_fit)
    out = accuracy.analytic_refit(max_evals=1, gpu_types=["a10"], in_sample=False)
    assert seen == [{"a100-40gb", "a40", "v100-32gb"}]
    r = out["regimes"]["gpu_type"]
    (v,) = r["folds"]
    assert v["held_out"] == "a10" and v["test_rows"] > 0 and v["train_rows"] > 3 * v["test_rows"] / 2
    assert r["rows"] == v["test_rows"]
    assert v["learned_correction"] in CORRECTIONS
    assert r["learned_mape"] == v["learned_mape"] > 0


def test_row_folds_of_the_refit_never_fit_on_their_test_rows(monkeypatch):
    fits = []

    def fake_fit(rows, base, *, max_evals=80, params=FIT_PARAMS, starts=1):
        fits.append({accuracy.table_row_id(r) for r in rows})
        return base.efficiency

    learned = []

    def fake_learned(train, test, by, seed, cfg, correction="auto"):
        # the real learned chain is run by the leave-one-type-out test above; here only
        # which rows each fold's learned model would see (five real fits take a minute)
        learned.append(({r.row_id for r in train}, {r.row_id for r in test}))
        return type("Fit", (), {"chosen": "none"})(), [0.1] * len(test)

    monkeypatch.setattr(calibrate, "fit_efficiency", fake_fit)
    monkeypatch.setattr(accuracy, "_learned_on", fake_learned)
    out = accuracy.analytic_refit(max_evals=1, regimes=("row",), in_sample=False)
    folds = out["regimes"]["row"]["folds"]
    assert len(fits) == len(folds) == len(learned) == 5
    measured = {accuracy.table_row_id(r) for r in accuracy.load_measured() if r.iter_time_s is not None}
    for train, (l_train, l_test) in zip(fits, learned):   # each fold trains on 4/5 of the rows, never all
        assert train < measured and len(train) > 0.7 * len(measured)
        assert l_train == train and not l_train & l_test     # the learned model sees the fold's training rows only
    assert sum(f["test_rows"] for f in folds) == out["regimes"]["row"]["rows"] == len(measured)


def test_arena_runtime_memory_facts_against_the_dp_memory_table():
    from estimators.evaluation.accuracy import dp_memory_check
    a, d = arena_runtime(), EstimatorConfig()
    assert not a.memory.recompute_layer_peak and not a.planner.dp_only_grad_accumulation
    assert d.memory.recompute_layer_peak and d.planner.dp_only_grad_accumulation     # launcher defaults
    assert a.memory.usable_fraction == d.memory.usable_fraction                      # no tuned limit
    out = dp_memory_check()
    assert out["fit_rows"] == 90 and out["oom_rows"] == 90
    # regression guard on the figures the two facts were chosen on (docs/estimators.md): 157/180
    assert out["fit_rows_called_feasible"] >= 88 and out["oom_rows_called_infeasible"] >= 69


def test_dp_only_without_grad_accumulation_runs_one_micro_batch():
    from dataclasses import replace as _r

    from estimators.analytic import AnalyticModel
    from estimators.grids import grid_fits
    from instances.grid import Grid, Shape
    from instances.models import get_model
    arch, grid = get_model("gpt__760M"), Grid(Shape("a100-40gb", 1, 2), 1)
    base = arena_runtime()
    acc = _r(base, planner=_r(base.planner, dp_only_grad_accumulation=True))
    planners = [AnalyticModel(dp_only=True, efficiency=c.efficiency, memory=c.memory, planner=c.planner).planner
                for c in (base, acc)]
    one, many = (p.proxy(arch, 2048, grid, dp_only=True) for p in planners)
    assert one.plan.microbatches == 1 and not one.feasible          # 1,024 samples per GPU at once
    assert planners[0].exhaustive(arch, 2048, grid, dp_only=True) is None
    assert not grid_fits(arch, 2048, grid, planners[0], dp_only=True)
    assert many.feasible and many.plan.microbatches > 1               # accumulating gradients, it fits
    assert grid_fits(arch, 2048, grid, planners[1], dp_only=True)
    # plans that are not pure DP keep their micro-batches under the same config
    planner = AnalyticModel(efficiency=base.efficiency, memory=base.memory, planner=base.planner).planner
    assert planner.proxy(arch, 2048, Grid(Shape("a100-40gb", 1, 2), 2)).plan.microbatches > 1


def test_oom_rows_contradicted_by_the_table_and_memory_ranking():
    from estimators.analytic import AnalyticModel
    from estimators.evaluation.accuracy import oom_boundary
    from estimators.reference import MeasuredRow, load_measured
    cfg = arena_runtime()
    planner = AnalyticModel(efficiency=cfg.efficiency, memory=cfg.memory).planner
    rows = [MeasuredRow("gpt__760M", 256, "a100-40gb", 1, 2, 5.0),
            MeasuredRow("gpt__760M", 128, "a100-40gb", 1, 2, None),    # a larger batch ran: contradicted
            MeasuredRow("gpt__760M", 512, "a100-40gb", 1, 2, None),    # only smaller batches ran
            MeasuredRow("gpt__760M", 64, "a100-40gb", 1, 4, None)]     # another shape: not contradicted
    out = oom_boundary(rows, planner)
    assert [r["contradicted_by_batches"] for r in out["rows"]] == [[256], [], []]
    assert out["contradicted_by_table"] == 1 and out["uncontradicted"] == 2
    assert 0.0 <= out["ranking_auc"] <= 1.0
    full = oom_boundary(load_measured(), planner)        # the real table (figures in docs/estimators.md)
    assert full["contradicted_by_table"] == 3 and full["uncontradicted"] == 8
    assert full["ranking_auc"] > 0.9      # the memory model orders the real OOM rows above most measured ones


def test_multi_start_fit_is_never_worse_than_its_single_start():
    from dataclasses import replace as _r

    from estimators.evaluation.calibrate import CORNER_VALUES, corner_starts, fit_efficiency, log_errors
    base = arena_runtime()
    base = _r(base, efficiency=neutral_start(base.efficiency))
    corners = corner_starts(base.efficiency)
    assert len(corners) == 8
    assert {tuple(round(v, 9) for v in (c.intra_bw_efficiency, c.inter_bw_efficiency, c.memory_bw_efficiency))
            for c in corners} == {
        (a, b, c) for a in CORNER_VALUES["intra_bw_efficiency"] for b in CORNER_VALUES["inter_bw_efficiency"]
        for c in CORNER_VALUES["memory_bw_efficiency"]}
    assert all(c.compute_efficiency("decoder") == base.efficiency.compute_efficiency("decoder") for c in corners)
    rows = [r for r in accuracy.load_measured() if r.iter_time_s is not None][:8]

    def msle(eff):
        return float((log_errors(_r(base, efficiency=eff), rows) ** 2).mean())

    one = fit_efficiency(rows, base, max_evals=20, starts=1)
    many = fit_efficiency(rows, base, max_evals=20, starts=3)
    assert msle(one) <= msle(base.efficiency) + 1e-12
    assert msle(many) <= min(msle(c) for c in corners + [base.efficiency]) + 1e-12


def test_best_scale_hand_cases():
    from estimators.evaluation.accuracy import best_scale
    assert best_scale([2.0]) == 0.5                     # one row: the factor that makes it exact
    # minimise 2|k - 1| + |4k - 1|: k = 0.25 costs 1.5, k = 1 costs 3
    assert best_scale([1.0, 1.0, 4.0]) == 0.25
    with pytest.raises(ValueError):
        best_scale([1.0, -0.5])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.2, 5.0), min_size=1, max_size=12))
def test_best_scale_is_the_minimum_of_the_absolute_percentage_error(ratios):
    from estimators.evaluation.accuracy import best_scale
    r = np.array(ratios)
    cost = lambda k: float(np.mean(np.abs(k * r - 1)))
    k = best_scale(r)
    grid = np.exp(np.linspace(-3, 3, 601))
    assert cost(k) <= min(cost(g) for g in grid) + 1e-9
    assert cost(k) <= cost(1.0) + 1e-12


def test_scale_oracle_removes_a_per_group_factor_and_keeps_the_rest():
    from estimators.evaluation.accuracy import scale_oracle
    from estimators.reference import MeasuredRow
    rows = [MeasuredRow("gpt__760M", b, t, 1, g, 1.0) for t in ("a100-40gb", "v100-32gb")
            for g in (1, 2) for b in (128, 256)]
    # a pure per-type factor (+20% on A100, -10% on V100) is fully absorbed per type
    pairs = [(r, 0.2 if r.gpu_type == "a100-40gb" else -0.1) for r in rows]
    out = scale_oracle(pairs)
    assert all(v["mape"] < 1e-12 for v in out.values())
    assert out["gpu_type"]["groups"] == 2 and out["model x gpu_type x shape"]["groups"] == 4
    # errors that only vary with the batch survive every grouping but the batch itself
    pairs = [(r, 0.1 if r.global_batch == 128 else -0.1) for r in rows]
    out = scale_oracle(pairs)
    assert out["gpu_type"]["mape"] == pytest.approx(out["model x gpu_type x shape"]["mape"])
    assert out["gpu_type"]["mape"] > 0.05


def test_accuracy_plots_are_written_from_the_report_rows(tmp_path):
    from engine.cli.accuracy_plots import ACCURACY_PLOT_FILES, write_accuracy_plots
    rows = [{"row": f"r{k}", "model": "gpt__760M", "gpu_type": t, "num_nodes": 1, "gpus_per_node": g,
             "global_batch": 256, "measured_s": 2.0 + k, "analytic": 0.1 * (-1) ** k,
             "learned": {"gpu_type": 0.05, "model": None, "row": -0.02}}
            for k, (t, g) in enumerate([("a100-40gb", 1), ("a100-40gb", 2), ("v100-32gb", 4)])]
    paths = write_accuracy_plots({"row_errors": rows}, tmp_path / "plots")
    assert [p.name for p in paths] == list(ACCURACY_PLOT_FILES)
    for p in paths:
        assert p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG"


def test_few_shot_curve_learns_a_new_type_from_its_telemetry():
    """Synthetic rows: each GPU type's measured time is its estimate times a factor that only
    that type has (feature 0 names the type). Without rows of the held-out type the learned
    correction cannot know its factor; with its telemetry in training it must learn it."""
    from estimators.evaluation.accuracy import learned_few_shot
    from estimators.learned import TrainingRecord
    rng = np.random.default_rng(0)
    factor = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.6}
    recs = []
    for code, t in enumerate(sorted(factor)):
        for i in range(60):
            est = float(rng.uniform(1, 10))
            recs.append(TrainingRecord(f"{t}:{i}", t, (float(code), est, float(rng.normal())), est,
                                       est * factor[t] * float(np.exp(rng.normal(0, 0.01)))))
    recs.append(TrainingRecord("tiny:0", "tiny", (9.0, 1.0, 0.0), 1.0, 1.0))   # too few rows: skipped
    out = learned_few_shot(recs, shots=(0, 16), seeds=(0,))
    assert out["skipped_types"] == ["tiny"]
    assert out["test_rows"] == 4 * (60 - 16)
    d = out["by_gpu_type"]["d"]
    assert d[0] > 0.3                  # unseen: the 1.6x factor is unknown (error ~ 1 - 1/1.6)
    assert d[16] < 0.1                 # 16 rows of telemetry teach it
    assert out["by_gpu_type"]["a"][0] < 0.1
    from instances.errors import InputError
    with pytest.raises(InputError):
        learned_few_shot(recs, shots=(-1,))


def test_grid_memory_margin_is_the_one_chosen_on_held_out_models():
    from estimators.analytic import AnalyticModel
    from estimators.evaluation.accuracy import choose_grid_margin, grid_margin_cv
    from estimators.planner import best_shape_result
    from estimators.reference import load_measured
    from instances.grid import Shape
    from instances.memory_rule import ARENA_GRID_MEMORY_MARGIN, GRID_MEMORY_MARGIN
    # hand case: the limit is the largest fitting fraction widened by one model's excess over the others
    ch = choose_grid_margin([0.40, 0.44, 0.30, 0.60], [True, True, True, False], ["a", "b", "b", "c"], 0.95)
    assert ch["headroom"] == pytest.approx(0.44 / 0.40 - 1) and ch["limit_fraction"] == pytest.approx(0.44 * 1.1)
    assert ch["margin"] == pytest.approx(0.95 / (0.44 * 1.1))
    cfg = arena_runtime()
    assert cfg.memory.grid_margin == ARENA_GRID_MEMORY_MARGIN and EstimatorConfig().memory.grid_margin == \
        GRID_MEMORY_MARGIN == 1.0
    planner = AnalyticModel(efficiency=cfg.efficiency, memory=cfg.memory, planner=cfg.planner).planner
    rows = load_measured()
    out = grid_margin_cv(rows, planner, seeds=(0,))
    # the constant is the margin chosen on all rows, rounded down (never stricter)
    assert ARENA_GRID_MEMORY_MARGIN == math.floor(out["all_rows"]["margin"] * 100) / 100
    assert out["leave_one_model_out"]["fitting_rows_called_infeasible"] == 0
    assert out["five_model_folds"]["0"]["fitting_rows_called_infeasible"] == 0
    assert out["leave_one_model_out"]["oom_rows_called_infeasible"] >= 5
    # the estimator in use: no row that ran is called infeasible, the same OOM rows are
    called = [best_shape_result(planner, r.model, r.global_batch, Shape(r.gpu_type, r.num_nodes, r.gpus_per_node))
              is None for r in rows]
    assert sum(c for c, r in zip(called, rows) if r.iter_time_s is not None) == 0
    assert sum(c for c, r in zip(called, rows) if r.iter_time_s is None) == out["all_rows_oom_called_infeasible"] >= 5
