"""Pipeline composition against hand-computed cases and an independent event simulation."""
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimators.compose import compose, pipeline_time, simulate_pipeline
from estimators.config import EfficiencyConfig
from estimators.layers import layer_costs
from estimators.timing import CatalogComm, RooflineTimer
from instances.errors import InputError
from instances.gpus import get_gpu
from instances.models import get_model
from instances.plan import Plan


def test_two_stages_four_microbatches_by_hand():
    # equal stages f=1, b=2: (m + p - 1) * (f + b) = 5 * 3 = 15 for both schedules
    assert pipeline_time([1, 1], [2, 2], 4, "gpipe") == pytest.approx(15)
    assert pipeline_time([1, 1], [2, 2], 4, "1f1b") == pytest.approx(15)
    # unequal: f=(1,3), b=(4,2); GPipe: forward phase 1+3+3*3 = 13, backward 2+4+3*4 = 18
    assert pipeline_time([1, 3], [4, 2], 4, "gpipe") == pytest.approx(31)
    assert simulate_pipeline([1, 3], [4, 2], 4, "gpipe") == pytest.approx(31)
    # 1F1B by hand on this case:
    # stage1 runs F0..F3 at 1-4, 4-7, 7-10, 10-13 interleaved with B; event simulation agrees
    assert pipeline_time([1, 3], [4, 2], 4, "1f1b") == pytest.approx(simulate_pipeline([1, 3], [4, 2], 4, "1f1b"))
    assert pipeline_time([1, 3], [4, 2], 4, "1f1b") < 31     # 1F1B overlaps the backward earlier


def test_single_stage_is_serial():
    assert pipeline_time([2.0], [3.0], 7, "1f1b") == pytest.approx(35)
    assert simulate_pipeline([2.0], [3.0], 7, "gpipe") == pytest.approx(35)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 5), st.floats(0.1, 5)), min_size=1, max_size=5),
       st.integers(1, 12), st.sampled_from(["gpipe", "1f1b"]))
def test_closed_forms_match_event_simulation(stages, m, schedule):
    f = [x for x, _ in stages]
    b = [y for _, y in stages]
    assert pipeline_time(f, b, m, schedule) == pytest.approx(simulate_pipeline(f, b, m, schedule), rel=1e-9)


def test_compose_single_rank_by_hand():
    """pp=1, dp=2, tp=1, no overlap: iteration = sum of layer rooflines + ring all-reduce + optimizer."""
    arch = get_model("tiny-gpt__4L")
    gpu = get_gpu("a100-40gb")
    eff = EfficiencyConfig(dp_overlap=False, recompute_activations=False, dp_sharded_optimizer=False,
                           allow_tf32=False)
    timer, comm = RooflineTimer(eff), CatalogComm(eff)
    n = len(arch.layers())
    plan = Plan(1, 2, 1, (n,), 1, "1f1b")
    bd = compose(arch, plan, global_batch=8, gpu=gpu, gpus_per_node=8, timer=timer, comm=comm, eff=eff)
    costs = layer_costs(arch, micro_batch=4)
    peak = gpu.fp32_flops
    comp = 0.0
    for c in costs:
        e = dict(eff.kind_compute_efficiency)[c.kind]
        comp += max(c.fwd_flops / (peak * e), c.fwd_bytes / (gpu.memory_bw_bytes_per_s * eff.memory_bw_efficiency))
        comp += max(c.bwd_flops / (peak * e), c.bwd_bytes / (gpu.memory_bw_bytes_per_s * eff.memory_bw_efficiency))
        comp += 2 * eff.layer_overhead_s
    grad = arch.param_count * 4
    ar = 2 * eff.collective_latency_s + grad / (gpu.intra_node_bw_bytes_per_s * eff.intra_bw_efficiency)
    opt = (arch.param_count * eff.optimizer_traffic_bytes_per_param
           / (gpu.memory_bw_bytes_per_s * eff.memory_bw_efficiency))
    assert bd.iteration_time_s == pytest.approx(comp + ar + opt, rel=1e-9)
    assert bd.dp_exposed_s == pytest.approx(ar)
    overlapped = compose(arch, plan, global_batch=8, gpu=gpu, gpus_per_node=8, timer=timer, comm=comm,
                         eff=replace(eff, dp_overlap=True))
    assert overlapped.iteration_time_s < bd.iteration_time_s
    # sharded optimizer update (Alpa prefer_reduce_scatter): reduce-scatter + all-gather, each
    # half the all-reduce's volume term, and the update over 1/dp of the parameters
    sh = replace(eff, dp_sharded_optimizer=True)
    bd_sh = compose(arch, plan, global_batch=8, gpu=gpu, gpus_per_node=8, timer=RooflineTimer(sh),
                    comm=CatalogComm(sh), eff=sh)
    assert bd_sh.dp_exposed_s == pytest.approx(ar, rel=1e-9)
    assert bd_sh.optimizer_s == pytest.approx(opt / 2, rel=1e-9)
    # activation recomputation adds one forward to every backward
    rc = replace(eff, recompute_activations=True)
    bd_rc = compose(arch, plan, global_batch=8, gpu=gpu, gpus_per_node=8, timer=RooflineTimer(rc),
                    comm=CatalogComm(rc), eff=rc)
    assert bd_rc.compute_s > bd.compute_s


def test_tf32_compute_roof_and_sum_roofline():
    """fp32 layers use the TF32 peak only where allowed and present; "sum" adds the roofs."""
    gpu, v100 = get_gpu("a100-40gb"), get_gpu("v100-32gb")
    on, off = EfficiencyConfig(allow_tf32=True), EfficiencyConfig(allow_tf32=False)
    assert on.compute_peak_flops(gpu, "float32") == gpu.tf32_flops
    assert off.compute_peak_flops(gpu, "float32") == gpu.fp32_flops
    assert on.compute_peak_flops(v100, "float32") == v100.fp32_flops          # no TF32 on V100
    assert on.compute_peak_flops(gpu, "float16") == gpu.fp16_flops
    c = layer_costs(get_model("wide_resnet__500M"), micro_batch=8)[5]
    f_max, _ = RooflineTimer(off).times(c, gpu, "float32")
    f_sum, _ = RooflineTimer(replace(off, roofline_combine="sum")).times(c, gpu, "float32")
    peak = gpu.fp32_flops * off.compute_efficiency(c.kind)
    mem = c.fwd_bytes / (gpu.memory_bw_bytes_per_s * off.memory_bw_efficiency)
    assert f_max == pytest.approx(max(c.fwd_flops / peak, mem) + off.layer_overhead_s)
    assert f_sum == pytest.approx(c.fwd_flops / peak + mem + off.layer_overhead_s)
    with pytest.raises(InputError):
        EfficiencyConfig(roofline_combine="min")
    with pytest.raises(InputError):
        EfficiencyConfig(allow_tf32="yes")


def test_cross_node_links_and_link_load_slow_down():
    arch = get_model("gpt__1.3B")
    gpu = get_gpu("a40")
    eff = EfficiencyConfig()
    kw = dict(global_batch=64, gpu=gpu, timer=RooflineTimer(eff), comm=CatalogComm(eff), eff=eff)
    n = len(arch.layers())
    plan = Plan(1, 4, 1, (n,), 4, "1f1b")
    intra = compose(arch, plan, gpus_per_node=4, **kw)
    inter = compose(arch, plan, gpus_per_node=2, **kw)
    loaded = compose(arch, plan, gpus_per_node=2, link_load=1.0, **kw)
    assert intra.iteration_time_s < inter.iteration_time_s < loaded.iteration_time_s
    assert math.isclose(sum(inter.shares().values()) <= 1.0 + 1e-9, True)
