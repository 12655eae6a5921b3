"""The launcher-runtime terms of the composition: embeddings and head whole on every
tensor rank, the measured per-layer tensor-parallel overhead, and the contention timer."""
import pytest

from estimators.base import Plan
from estimators.compose import compose
from estimators.config import EfficiencyConfig
from estimators.evaluation.local_accuracy import ContendedTimer, RuntimeTerms, launcher_runtime
from estimators.layers import layer_costs
from estimators.timing import CatalogComm, RooflineTimer
from instances.errors import InputError
from instances.gpus import get_gpu
from instances.models import get_model

ARCH = get_model("tiny-gpt__4L")
GPU = get_gpu("a100-40gb")


def _bd(eff, tp=2, timer=None):
    n = len(ARCH.layers())
    return compose(ARCH, Plan(1, 1, tp, (n,), 1, "1f1b"), global_batch=8, gpu=GPU, gpus_per_node=8,
                   timer=timer or RooflineTimer(eff), comm=CatalogComm(eff), eff=eff)


def test_replicated_embedding_head_costs_the_unsharded_layers_and_no_allreduce():
    eff = EfficiencyConfig(dp_overlap=False)
    rep = EfficiencyConfig(dp_overlap=False, tp_replicated_embedding_head=True)
    timer = RooflineTimer(eff)
    whole, shard = layer_costs(ARCH, micro_batch=8, tp=1), layer_costs(ARCH, micro_batch=8, tp=2)
    delta = 0.0
    comm = CatalogComm(eff)
    for w, s in zip(whole, shard):
        if w.kind in ("embedding", "head"):
            delta += sum(timer.times(w, GPU, ARCH.dtype)) - sum(timer.times(s, GPU, ARCH.dtype))
            ar = comm.allreduce_s(s.tp_allreduce_bytes, 2, GPU, "intra")
            delta -= ar * (s.tp_allreduces_fwd + s.tp_allreduces_bwd)
            delta -= comm.allreduce_s(s.tp_small_allreduce_bytes, 2, GPU, "intra")
    a, b = _bd(eff), _bd(rep)
    assert b.pipeline_s - a.pipeline_s == pytest.approx(delta, rel=1e-9)
    assert b.optimizer_s > a.optimizer_s            # whole embedding/head parameters on the rank
    assert _bd(rep, tp=1).iteration_time_s == pytest.approx(_bd(eff, tp=1).iteration_time_s)


def test_tp_layer_overhead_is_charged_per_decoder_pass_only_under_tp():
    eff = EfficiencyConfig(dp_overlap=False)
    ov = EfficiencyConfig(dp_overlap=False, tp_layer_overhead_fwd_s=1e-3, tp_layer_overhead_bwd_s=2e-3)
    decoders = sum(1 for s in ARCH.layers() if s.kind == "decoder")
    assert _bd(ov).stage_fwd_s[0] - _bd(eff).stage_fwd_s[0] == pytest.approx(decoders * 1e-3)
    assert _bd(ov).stage_bwd_s[0] - _bd(eff).stage_bwd_s[0] == pytest.approx(decoders * 2e-3)
    assert _bd(ov, tp=1).iteration_time_s == pytest.approx(_bd(eff, tp=1).iteration_time_s)
    with pytest.raises(InputError):
        EfficiencyConfig(tp_layer_overhead_fwd_s=-1.0)
    with pytest.raises(InputError):
        EfficiencyConfig(tp_replicated_embedding_head=1)


def test_contended_timer_and_runtime_terms():
    eff = EfficiencyConfig(dp_overlap=False)
    base = RooflineTimer(eff)
    slow = ContendedTimer(base, 2.0)
    c = layer_costs(ARCH, micro_batch=8)[1]
    assert slow.times(c, GPU, ARCH.dtype) == pytest.approx(tuple(2 * t for t in base.times(c, GPU, ARCH.dtype)))
    assert slow.optimizer_s(1e6, GPU, ARCH.dtype) == pytest.approx(2 * base.optimizer_s(1e6, GPU, ARCH.dtype))
    t = RuntimeTerms(2, 8, 1e-3, solo_s=(1.0, 2.0), concurrent_s=(1.5, 3.0), dtensor_s=(2.0, 3.0),
                     modelled_allreduce_s=(0.25, 0.5))
    assert t.contention == pytest.approx(1.5)
    assert t.tp_overhead_s == pytest.approx((0.25, 0.0))              # clipped at 0
    assert RuntimeTerms(2, 8, 0.0, (1.0, 1.0), (0.5, 0.5), (1, 1), (0, 0)).contention == 1.0
    one = RuntimeTerms(1, 8, 2e-3)                   # one rank: only the step overhead is measured
    assert one.contention == 1.0 and one.tp_overhead_s == (0.0, 0.0)
    eff, _ = launcher_runtime()
    assert eff.tp_replicated_embedding_head and eff.dp_overlap
    assert not launcher_runtime(cpu=True)[0].dp_overlap     # gloo sums on the compute cores


def test_step_overhead_is_added_once_per_iteration():
    eff = EfficiencyConfig(dp_overlap=False)
    over = EfficiencyConfig(dp_overlap=False, step_overhead_s=0.01)
    for tp in (1, 2):
        a, b = _bd(eff, tp=tp), _bd(over, tp=tp)
        assert b.iteration_time_s - a.iteration_time_s == pytest.approx(0.01)
        assert b.shares()["step_overhead"] == pytest.approx(0.01 / b.iteration_time_s)
    with pytest.raises(InputError):
        EfficiencyConfig(step_overhead_s=-1e-3)


def test_micro_batch_timer_uses_the_nearest_profiled_size():
    from estimators.evaluation.local_accuracy import MicroBatchTimer
    from estimators.timing import ProfiledTimer
    eff = EfficiencyConfig(layer_overhead_s=0.0)
    dec = next(c for c in layer_costs(ARCH, micro_batch=1) if c.kind == "decoder")
    key = (dec.kind, tuple(dec.signature), ARCH.dtype, 1)
    inner = ProfiledTimer(GPU.name, {key: (1e9, 1e9)}, RooflineTimer(eff))     # the largest size's rate
    t = MicroBatchTimer(inner, {key: {2: (1e8, 2e8), 8: (1e9, 1e9)}})
    c2, c8 = (next(c for c in layer_costs(ARCH, micro_batch=m) if c.kind == "decoder") for m in (2, 8))
    assert t.times(c2, GPU, ARCH.dtype) == pytest.approx((c2.fwd_flops / 1e8, c2.bwd_flops / 2e8))
    assert t.times(c8, GPU, ARCH.dtype) == pytest.approx(inner.times(c8, GPU, ARCH.dtype))
    c3 = next(c for c in layer_costs(ARCH, micro_batch=3) if c.kind == "decoder")   # nearer 2 than 8
    assert t.times(c3, GPU, ARCH.dtype)[0] == pytest.approx(c3.fwd_flops / 1e8)
    head = next(c for c in layer_costs(ARCH, micro_batch=2) if c.kind == "head")  # not profiled: inner
    assert t.times(head, GPU, ARCH.dtype) == inner.times(head, GPU, ARCH.dtype)


def test_summarize_passes_takes_the_median_per_plan():
    from estimators.evaluation.local_accuracy import LocalResult, summarize_passes
    passes = [[LocalResult(1, 1, 1, 1, 1.0, e1), LocalResult(2, 1, 1, 1, 1.0, e2)]
              for e1, e2 in ((1.1, 0.8), (0.9, 0.7), (1.05, 1.5))]
    passes[1].append(LocalResult(1, 2, 1, 1, None, 1.0, "run failed"))
    s = summarize_passes(passes)
    by = {(p["dp"], p["tp"]): p for p in s["plans"]}
    assert by[(1, 1)]["median_error"] == pytest.approx(0.05)
    assert by[(2, 1)]["median_error"] == pytest.approx(-0.2)
    assert by[(1, 2)]["median_error"] is None and by[(1, 2)]["errors"] == [None]
    assert s["mape"] == pytest.approx((0.05 + 0.2) / 2)
    assert s["pass_mape"][0] == pytest.approx((0.1 + 0.2) / 2) and s["pass_count"] == 3
    assert s["mape_cache"] is None                       # results without the cache model's twin
    import json

    from engine.cli.commands.estimate import local_json
    out = json.loads(json.dumps(local_json(passes, s)))  # --json: the summary and every pass's runs
    assert out["pass_count"] == 3 and [len(p) for p in out["passes"]] == [2, 3, 2]
    assert out["passes"][1][2]["measured_s"] is None and out["passes"][0][0]["rel_error"] == pytest.approx(0.1)


def test_local_comparison_of_wide_resnet_has_no_tensor_parallel_plan():
    from estimators.evaluation.local_accuracy import against_local
    with pytest.raises(InputError) as e:                 # checked before anything is profiled
        against_local(model="tiny-wide_resnet__50", plans=((1, 2, 1, 1),))
    assert e.value.field == "plans"


def test_cache_model_from_the_profiled_working_set(tmp_path):
    from estimators.evaluation.local_accuracy import CacheTimer, cache_hit, step_working_set
    from estimators.profile_store import LayerProfile, ProfileStore
    from estimators.timing import ProfiledTimer
    assert cache_hit(None, 8.0) == 0.0 and cache_hit(2.0, 0.0) == 0.0
    assert cache_hit(2.0, 8.0) == pytest.approx(0.75) and cache_hit(9.0, 8.0) == 0.0
    store = ProfileStore(tmp_path)
    recs = []
    for spec in {(s.kind, tuple(s.signature)): s for s in ARCH.layers()}.values():
        for mb in (2, 8):         # parameters 1 kB, saved 100 B per sample; warm = half the cold time
            recs.append(LayerProfile("cpu", "float32", spec.kind, tuple(spec.signature), 1, mb, 1e-3, 2e-3, 1e9, 1e9,
                                     "full", 1e-3, 2e-3, 1.0, 1, 3e-3, warm_fwd_s=0.5e-3, warm_bwd_s=1e-3,
                                     param_bytes=1000.0, saved_bytes=100.0 * mb, flush_bytes=8e6))
    store.put_layers(recs)
    n = len(ARCH.layers())
    assert step_working_set(ARCH, Plan(1, 1, 1, (n,), 1, "1f1b"), 8, store, "cpu") == pytest.approx(n * (2000 + 800))
    # 1F1B: the first of two stages holds two micro-batches of its layers' activations
    half = n // 2
    ws = step_working_set(ARCH, Plan(2, 1, 1, (half, n - half), 4, "1f1b"), 2, store, "cpu")
    assert ws == pytest.approx(max(half * (2000 + 2 * 200), (n - half) * (2000 + 200)))
    # a layer without a record (another model's here) counts its catalog parameters and activations
    moe = get_model("tiny-moe__2L")
    cat = layer_costs(moe, micro_batch=8)
    assert step_working_set(moe, Plan(1, 1, 1, (len(cat),), 1, "1f1b"), 8, store, "cpu") == pytest.approx(
        sum(2 * c.params * moe.dtype_bytes + c.activation_bytes for c in cat))
    eff = EfficiencyConfig(layer_overhead_s=0.0)
    dec = next(c for c in layer_costs(ARCH, micro_batch=8) if c.kind == "decoder")
    inner = ProfiledTimer("cpu", {}, RooflineTimer(eff))
    f, b = inner.times(dec, get_gpu("cpu"), ARCH.dtype)
    assert CacheTimer.from_store(inner, store, "cpu", 0.0).times(dec, get_gpu("cpu"), ARCH.dtype) == (f, b)
    assert CacheTimer.from_store(inner, store, "cpu", 0.5).times(dec, get_gpu("cpu"), ARCH.dtype) == \
        pytest.approx((0.75 * f, 0.75 * b))           # halfway between cold and warm (half of it)


def _local_runtime(tmp_path, terms):
    from estimators.analytic import AnalyticModel
    from estimators.evaluation.local_accuracy import CacheTimer, LocalRuntime
    from estimators.profile_store import LayerProfile, ProfileStore
    store = ProfileStore(tmp_path)
    store.put_layers([LayerProfile("cpu", "float32", s.kind, tuple(s.signature), tp, mb, 1e-3, 2e-3, 1e9, 1e9,
                                   "full", 1e-3, 2e-3, 1.0, 1, 3e-3)
                      for s in {(s.kind, tuple(s.signature)): s for s in ARCH.layers()}.values()
                      for tp in (1, 2) for mb in (1, 2, 4, 8)])
    eff, mem = launcher_runtime(cpu=True)
    planner = AnalyticModel(profile_store=store, profile_device="cpu", efficiency=eff, memory=mem).planner
    return LocalRuntime(ARCH, 8, "cpu", get_gpu("cpu"), planner, eff, terms, store,
                        CacheTimer.from_store(planner.timer, store, "cpu", 0.0), 0.0)


def test_local_runtime_model_picks_the_fastest_measured_layout(tmp_path):
    from estimators.evaluation.local_accuracy import LocalRuntimeModel
    from estimators.online import OnlineModel
    from instances.grid import Grid, Shape
    from instances.jobs import Job
    terms = {1: RuntimeTerms(1, 8, 1e-3),
             2: RuntimeTerms(2, 8, 2e-3, (1.0, 1.0), (1.3, 1.3), (0.5, 0.5), (0.01, 0.01))}
    rt = _local_runtime(tmp_path, terms)
    model = LocalRuntimeModel(rt)
    job = Job("j", "tiny-gpt__4L", 8, 10, 0.0)
    one, two, deep = Grid(Shape("cpu", 1, 1), 1), Grid(Shape("cpu", 1, 2), 1), Grid(Shape("cpu", 1, 2), 2)
    e1 = model.estimate(job, one)
    assert e1.feasible and e1.plan == rt.plan(1, 1, 1, 1)
    assert e1.iteration_time_s == pytest.approx(rt.evaluate(rt.plan(1, 1, 1, 1)).iteration_time_s)
    # two ranks, one stage: the faster of data and tensor parallel, with the 2-rank terms
    options = {p: rt.evaluate(p).iteration_time_s for p in (rt.plan(2, 1, 1, 1), rt.plan(1, 2, 1, 1))}
    e2 = model.estimate(job, two)
    assert e2.plan == min(options, key=options.get) and e2.iteration_time_s == pytest.approx(min(options.values()))
    assert model.estimate(job, deep).plan == rt.plan(1, 1, 2, 4)        # two stages of 4 micro-batches
    # the 2-rank terms are charged: contention stretches the compute, the step overhead is added
    assert rt.evaluate(rt.plan(2, 1, 1, 1)).iteration_time_s > \
        _local_runtime(tmp_path / "x", {2: RuntimeTerms(2, 8, 1e-3)}).evaluate(rt.plan(2, 1, 1, 1)).iteration_time_s
    # a rank count without measured terms runs nothing; another model or device is refused
    assert not model.estimate(job, Grid(Shape("cpu", 1, 4), 1)).feasible
    with pytest.raises(InputError):
        model.estimate(Job("k", "tiny-gpt__2L", 8, 10, 0.0), one)
    with pytest.raises(InputError):
        model.estimate(job, Grid(Shape("a100-40gb", 1, 1), 1))
    # as an online model's base: its plans give the communication share (none on one rank)
    online = OnlineModel(base=model, calibrated_types=frozenset({"cpu"}))
    assert online.comm_share(job, one) == 0.0 < online.comm_share(job, two)


def test_pipeline_pass_overhead_is_charged_per_stage_pass_only_under_pp():
    n = len(ARCH.layers())
    eff = EfficiencyConfig(dp_overlap=False)
    ov = EfficiencyConfig(dp_overlap=False, pp_pass_overhead_s=1e-3)

    def bd(e, pp):
        split = (n,) if pp == 1 else (n // 2, n - n // 2)
        return compose(ARCH, Plan(pp, 1, 1, split, 4, "1f1b"), global_batch=8, gpu=GPU, gpus_per_node=8,
                       timer=RooflineTimer(e), comm=CatalogComm(e), eff=e)

    a, b = bd(eff, 2), bd(ov, 2)
    passes = zip(a.stage_fwd_s + a.stage_bwd_s, b.stage_fwd_s + b.stage_bwd_s)
    assert all(y - x == pytest.approx(1e-3) for x, y in passes)
    assert b.pp_overhead_s == pytest.approx(4 * 2e-3) and a.pp_overhead_s == 0.0
    assert b.iteration_time_s > a.iteration_time_s
    assert sum(b.shares().values()) <= 1.0 + 1e-9
    assert bd(ov, 1).iteration_time_s == pytest.approx(bd(eff, 1).iteration_time_s)     # one stage: no schedule
    with pytest.raises(InputError):
        EfficiencyConfig(pp_pass_overhead_s=-1e-3)


def test_pipeline_pass_overhead_inverts_the_composed_probe():
    from estimators.compose import pipeline_time
    from estimators.evaluation.local_accuracy import pipeline_pass_overhead_s
    for stages, m, o, send in ((2, 4, 1e-3, 2e-4), (3, 8, 5e-4, 1e-3), (2, 1, 2e-3, 0.0)):
        fwd = [o + (send if i < stages - 1 else 0.0) for i in range(stages)]
        bwd = [o + (send if i > 0 else 0.0) for i in range(stages)]
        step = pipeline_time(fwd, bwd, m, "1f1b")
        assert pipeline_pass_overhead_s(step, stages, m, send) == pytest.approx(o, rel=1e-9)
    assert pipeline_pass_overhead_s(1e-4, 2, 4, 1e-3) == 0.0          # the sends alone take longer


def test_local_runtime_charges_the_measured_pipeline_overhead_to_pipeline_plans(tmp_path):
    from dataclasses import replace
    base = RuntimeTerms(2, 8, 1e-3, (1.0, 1.0), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0))
    plain = _local_runtime(tmp_path / "a", {2: base})
    over = _local_runtime(tmp_path / "b", {2: replace(base, pp_pass_overhead_s=1e-3)})
    pp2, dp2 = plain.plan(1, 1, 2, 4), plain.plan(2, 1, 1, 1)
    assert over.evaluate(pp2).breakdown.pp_overhead_s == pytest.approx(4 * 2e-3)
    assert over.evaluate(pp2).iteration_time_s > plain.evaluate(pp2).iteration_time_s
    assert over.evaluate(dp2).iteration_time_s == pytest.approx(plain.evaluate(dp2).iteration_time_s)


def test_runtime_terms_are_measured_by_real_gloo_ranks():
    """Two spawned gloo ranks: the launcher's DTensor layer, the plain sharded layer alone
    and together, the step overhead, and the pipeline probe under torch's 1F1B schedule."""
    from estimators.evaluation.local_accuracy import profile_runtime_terms
    eff, _ = launcher_runtime(cpu=True)
    t = profile_runtime_terms("tiny-gpt__2L", ranks=2, micro_batch=8, comm=CatalogComm(eff), gpu=get_gpu("cpu"),
                              warmup=1, repeats=3)
    assert t.ranks == 2 and t.step_overhead_s > 0
    assert min(t.solo_s + t.concurrent_s + t.dtensor_s) > 0 and t.contention >= 1.0
    assert t.pp_probe_step_s > 0 and 0.0 <= t.pp_pass_overhead_s < t.pp_probe_step_s
    assert min(t.optimizer_s) > 0
    assert t.optimizer_s[0] > t.optimizer_s[1]      # Adam over DTensors pays DTensor's dispatch (about 3x here)


def test_tp_optimizer_overhead_is_charged_once_per_iteration_only_under_tp(tmp_path):
    from dataclasses import replace
    eff = EfficiencyConfig(dp_overlap=False)
    ov = EfficiencyConfig(dp_overlap=False, tp_optimizer_overhead_s=0.02)
    for tp in (1, 2):
        a, b = _bd(eff, tp=tp), _bd(ov, tp=tp)
        extra = 0.02 if tp > 1 else 0.0
        assert b.optimizer_s - a.optimizer_s == pytest.approx(extra)
        assert b.iteration_time_s - a.iteration_time_s == pytest.approx(extra)
    with pytest.raises(InputError):
        EfficiencyConfig(tp_optimizer_overhead_s=-1.0)
    assert RuntimeTerms(2, 8, 0.0, optimizer_s=(0.03, 0.01)).tp_optimizer_overhead_s == pytest.approx(0.02)
    assert RuntimeTerms(2, 8, 0.0, optimizer_s=(0.01, 0.03)).tp_optimizer_overhead_s == 0.0     # clipped at 0
    base = RuntimeTerms(2, 8, 1e-3, (1.0, 1.0), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0))
    plain = _local_runtime(tmp_path / "a", {2: base})
    over = _local_runtime(tmp_path / "b", {2: replace(base, optimizer_s=(0.03, 0.01))})
    tp2, dp2 = plain.plan(1, 2, 1, 1), plain.plan(2, 1, 1, 1)
    assert over.evaluate(tp2).iteration_time_s - plain.evaluate(tp2).iteration_time_s == pytest.approx(0.02)
    assert over.evaluate(dp2).iteration_time_s == pytest.approx(plain.evaluate(dp2).iteration_time_s)
