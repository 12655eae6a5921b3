"""``learned-level``: the analytic estimate x one learned factor per model family and GPU
type (the ``type_level`` correction). It ranks the shapes of one GPU type exactly as the
analytic model does and corrects only the level between GPU types."""
from __future__ import annotations

import numpy as np
import pytest

from estimators.group_correction import TYPE_LEVELS, GroupMedianCorrection
from estimators.learned import FEATURES
from estimators.perf import make_performance_model
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from instances.jobs import Job


def _row(family: str, peak: float, nodes: int, gpn: int) -> list[float]:
    x = dict.fromkeys(FEATURES, 0.0)
    x[f"fam_{family}"] = 1.0
    x["log_peak_flops"], x["num_nodes"], x["gpus_per_node"], x["num_gpus"] = peak, nodes, gpn, nodes * gpn
    return [x[f] for f in FEATURES]


def test_type_level_is_one_shrunk_median_per_family_and_gpu_type():
    X = [_row("gpt", 30.0, 1, 4), _row("gpt", 30.0, 2, 8), _row("gpt", 31.0, 1, 8), _row("moe", 30.0, 1, 4)]
    y = [0.1, 0.3, 0.5, 0.7]
    reg = GroupMedianCorrection(FEATURES, levels=TYPE_LEVELS).fit(X, y)
    got = reg.predict([_row("gpt", 30.0, 4, 8), _row("gpt", 30.0, 1, 1), _row("gpt", 31.0, 1, 8),
                       _row("moe", 30.0, 1, 4), _row("llama", 30.0, 1, 4)])
    # gpt on the first type: median 0.2 of two rows, shrunk by 2 / (2 + 2), for every shape;
    # one row is not a group (gpt on the second type, moe); no family row at all: none
    assert got.tolist() == pytest.approx([0.1, 0.1, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        GroupMedianCorrection(FEATURES, levels=())


def test_learned_level_ranks_one_gpu_type_like_analytic():
    analytic = make_performance_model("analytic")
    level = make_performance_model("learned-level")
    assert level.name == "learned-level" and level.chosen == "type_level"
    from estimators.grids import candidate_grids
    job = Job("j", "gpt__1.3B", 256, 10, 0.0)
    cluster = ClusterSpec((NodeGroup("a100-40gb", 2, 8), NodeGroup("v100-32gb", 2, 8), NodeGroup("h100-sxm", 2, 8)))
    factors: dict[str, set] = {}
    for g in candidate_grids(job, cluster, max_gpus=16):
        a, b = analytic.estimate(job, g), level.estimate(job, g)
        assert b.plan == a.plan
        factors.setdefault(g.shape.gpu_type, set()).add(round(b.iteration_time_s / a.iteration_time_s, 9))
    assert all(len(f) == 1 for f in factors.values()), factors       # one factor per GPU type
    assert factors["h100-sxm"] == {1.0}                                 # no measured row of that type: none
    assert factors["v100-32gb"] != factors["a100-40gb"]
    with pytest.raises(InputError):
        make_performance_model("learned-level", correction="group")


def test_held_out_models_rank_one_type_as_analytic_and_types_no_worse():
    """On the Arena table with whole models held out (each row's factor from a model that
    never saw that model), the choice inside one GPU type is exactly the analytic one, and
    across GPU types by total throughput at least as good."""
    from estimators.analytic import AnalyticModel
    from estimators.config import arena_runtime
    from estimators.evaluation.accuracy import choice_report, forced_cv
    from estimators.learned import records_from_table, table_row_id
    from estimators.reference import load_measured
    cfg = arena_runtime()
    analytic = AnalyticModel(efficiency=cfg.efficiency, memory=cfg.memory, planner=cfg.planner)
    rows = [r for r in load_measured() if r.iter_time_s is not None]
    records = records_from_table(rows, analytic)
    errors = forced_cv(records, "model", "type_level", cfg=cfg)
    by_id = {table_row_id(r): r for r in rows}
    base = {rec.row_id: rec.analytic_s / rec.measured_s - 1 for rec in records}
    level, ana = choice_report(by_id, errors), choice_report(by_id, base)
    for throughput in ("total", "per_gpu"):
        assert level["same GPU type"][throughput]["mean"] == pytest.approx(ana["same GPU type"][throughput]["mean"])
    assert level["any GPU type"]["total"]["mean"] >= ana["any GPU type"]["total"]["mean"]
    assert np.mean(np.abs(list(errors.values()))) < 0.2


def test_the_baselines_twin_of_learned_level_and_learned_choice_is_of_the_same_kind():
    """The data-parallel-only baselines decide with a twin of the policies' model: of the
    same kind, so that a comparison under ``--perf learned-level`` stays fair."""
    from estimators.perf import DpOnlyTwin
    model = make_performance_model("learned-level")
    twin = DpOnlyTwin()(model)
    assert (twin.kind, twin.name, twin.chosen) == ("learned-level", "learned-level-dp", "type_level") and twin.dp_only
    assert make_performance_model("learned-choice", correction="none").kind == "learned-choice"
