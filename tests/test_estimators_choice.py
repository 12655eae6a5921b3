"""Grid-choice quality (estimators/choice.py): hand cases, the table-contradiction checks,
and the report on the Arena table."""
import pytest

from estimators.choice import ChoicePoint, batch_suspects, choice_quality, choice_score, point_from_row_id, suspect_pair


def P(shape, measured, estimated, model="m", batch=256, gpu="a40"):
    nodes, gpn = shape
    return ChoicePoint(model, batch, gpu, nodes, gpn, measured, estimated)


def test_the_fraction_is_the_true_throughput_of_the_estimates_pick_over_the_best():
    # 1x2 measured 10 s, 2x2 measured 6 s, 4x2 measured 5 s (per GPU: 12.8, 10.7, 6.4 samples/s)
    pts = [P((1, 2), 10.0, 9.0), P((2, 2), 6.0, 7.0), P((4, 2), 5.0, 2.0)]
    total = choice_quality(pts, "same GPU type", "total")
    assert total["groups"] == 1 and total["mean"] == pytest.approx(1.0)      # picks 4x2, the fastest
    per_gpu = choice_quality(pts, "same GPU type", "per_gpu")
    # estimated per GPU: 1x2 14.2, 2x2 9.1, 4x2 16 -> picks 4x2; true 6.4 / 12.8
    assert per_gpu["mean"] == pytest.approx((256 / 5 / 8) / (256 / 10 / 2))
    assert per_gpu["worst"]["group"] == "m 256 a40" and len(per_gpu["misses"]) == 1
    assert per_gpu["misses"][0]["chosen"] == "a40 4x2" and per_gpu["misses"][0]["best"] == "a40 1x2"
    assert per_gpu["spearman_mean"] == pytest.approx(-0.5)          # ranks (3, 2, 1) vs (2, 1, 3)
    # a single-shape group is no choice; a perfect estimate always picks the best
    assert choice_quality([P((1, 2), 10.0, 1.0)], "same GPU type")["groups"] == 0
    exact = [P(s, t, t) for s, t in (((1, 2), 10.0), ((2, 2), 6.0), ((4, 2), 5.0))]
    assert choice_score(exact) == 1.0


def test_the_tables_own_contradictions_are_named():
    small, large = P((1, 2), 40.0, 20.0), P((2, 2), 10.0, 12.0)               # 2x the GPUs, 4x faster
    assert suspect_pair(small, large).startswith("superlinear")
    assert suspect_pair(P((1, 2), 20.0, 20.0), P((2, 2), 10.5, 10.0)) is None  # about linear
    one, two = P((1, 16), 14.0, 7.0, gpu="v100"), P((2, 8), 8.3, 8.0, gpu="v100")
    assert suspect_pair(one, two).startswith("more nodes faster")
    assert suspect_pair(P((1, 2), 1.0, 1.0), P((1, 2), 1.0, 1.0, gpu="a100")) is None   # other type
    lo, hi = P((2, 2), 16.0, 16.0, batch=256), P((2, 2), 40.0, 32.0, batch=512)
    assert set(batch_suspects([lo, hi])) == {lo, hi} and batch_suspects([lo, hi])[hi].startswith("batch superlinear")
    assert batch_suspects([lo, P((2, 2), 30.0, 30.0, batch=512)]) == {}
    q = choice_quality([small, large], "same GPU type", "per_gpu")
    assert q["misses_table_suspect"] == 1 and q["clean"]["groups"] == 0


def test_row_ids_of_the_table():
    p = point_from_row_id("arena:gpt__1.3B:256:a100-40gb:2x4", 3.0, 2.5)
    assert (p.model, p.global_batch, p.gpu_type, p.num_nodes, p.gpus_per_node) == ("gpt__1.3B", 256, "a100-40gb", 2, 4)
    assert point_from_row_id("run:3:x", 1.0, 1.0) is None


def test_analytic_grid_choice_on_the_arena_table():
    """Regression guard on the figures in docs/estimators.md (analytic, in-sample constants)."""
    from estimators.analytic import AnalyticModel
    from estimators.config import arena_runtime
    from estimators.planner import best_shape_result
    from estimators.reference import load_measured
    from instances.grid import Shape
    cfg = arena_runtime()
    planner = AnalyticModel(efficiency=cfg.efficiency, memory=cfg.memory, planner=cfg.planner).planner
    pts = []
    for r in load_measured():
        if r.iter_time_s is None:
            continue
        res = best_shape_result(planner, r.model, r.global_batch, Shape(r.gpu_type, r.num_nodes, r.gpus_per_node))
        pts.append(ChoicePoint(r.model, r.global_batch, r.gpu_type, r.num_nodes, r.gpus_per_node, r.iter_time_s,
                               res.iteration_time_s))
    q = choice_quality(pts, "same GPU type", "per_gpu")
    assert q["groups"] == 94 and q["mean"] > 0.965
    assert q["misses"] and q["misses_table_suspect"] == len(q["misses"])     # every miss: the table's own
    assert q["clean"]["mean"] > 0.99 and q["clean"]["fraction_ge_90"] == 1.0
    assert choice_quality(pts, "any GPU type", "per_gpu")["fraction_ge_90"] == 1.0
