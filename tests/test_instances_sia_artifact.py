"""The Sia artifact importer, goodput jobs and their oracle, on the project's own fixture
in the artifact's layout (tests/data/sia_artifact: no data of the artifact itself)."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from instances.errors import InputError
from instances.goodput import BatchPlan, GoodputJob, GoodputOracle
from instances.grid import Grid, Shape
from instances.sia_artifact import (
    artifact_root,
    list_workloads,
    load_app_settings,
    load_artifact,
    load_restart_penalties,
)
from instances.sia_instances import load_sia_instance, sia_instance_names

FIXTURE = Path(__file__).parent / "data" / "sia_artifact"
SIM = FIXTURE / "sia-simulator"


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "art"
    shutil.copytree(FIXTURE, dst)
    return dst / "sia-simulator"


def _fresh(root: Path):
    from instances import sia_artifact, sia_instances
    sia_artifact.forget_loaded()
    sia_instances.sia_world.cache_clear()
    return root


def test_instance_from_the_fixture():
    inst = load_sia_instance("sia:mini/workload-1", FIXTURE)      # the repository root form
    assert inst.cluster.gpus_by_type() == {"t4": 8, "rtx-2080ti": 8}
    assert inst.round_interval_s == 60.0 and inst.horizon_rounds is None
    assert [j.job_id for j in inst.jobs] == ["toy-0", "big-1", "toy-2", "toy-3"]
    toy = inst.jobs[0]
    assert isinstance(toy, GoodputJob) and toy.model == "sia:toy" and toy.application == "toy"
    assert (toy.requested_gpus, toy.requested_batch, toy.arrival_s) == (2, 32, 10.0)
    # B0 is the smallest validated batch; the target is the smallest progress any curve
    # reaches at max_epochs = 3 (curves at 5000, 4750, 4500 per epoch)
    assert (toy.global_batch, toy.max_batch) == (16, 128)
    assert toy.progress_target == pytest.approx(13500.0) and toy.num_iterations == 13500
    # restart time from the name chain of applications.py, penalty from sia.py
    assert (toy.restart_s, toy.restart_penalty_s) == (20.0, 20.0)
    big = inst.jobs[1]
    assert (big.restart_s, big.restart_penalty_s, big.progress_target) == (100.0, 90.0, pytest.approx(4800.0))
    assert sia_instance_names(SIM) == ["sia:mini/workload-1", "sia:mini/workload-2", "sia:pipes/workload-1"]


def test_config_settings_and_penalties_read_without_running_the_files():
    art = load_artifact(SIM)
    assert art.config.nodes == {"aws": 2, "rtx": 1}         # the last assignment wins
    assert art.config.slowdowns["toy"] == 1.5
    assert art.config.sia_params["sia_default_p_val"] == -0.5
    s = load_app_settings(SIM)
    assert s["toy"]["aws"].max_epochs == 3 and s["toy"]["aws"].rescale_time_s == 20.0
    assert s["toy"]["rtx"].max_local_bsz == 24 and s["toy"]["aws"].max_local_bsz is None
    assert s["pipe"]["aws"].num_stages == 4
    table, default = load_restart_penalties(SIM)
    assert table == {"toy": 20.0, "big": 90.0} and default == 30.0


def test_throughput_interpolation_and_goodput_by_hand():
    inst = load_sia_instance("sia:mini/workload-1", SIM)
    world = inst.oracle.world
    app = world.on("toy", "t4")
    # a measured placement (one GPU): linear in the per-GPU batch between profiled points
    assert app.step_sync((1,), 12) == pytest.approx((0.010 + 0.002 * 12, 0.0))
    assert app.step_sync((1,), 64) is None                          # beyond the profile
    # a measured two-node placement "44"
    assert app.step_sync((4, 4), 16) == pytest.approx((0.010 + 0.032 + 0.008, 0.008))
    # fixed batch 32 on 2 GPUs: 16 per GPU, no accumulation; gain at epoch 0 by hand
    job = inst.jobs[0]
    seg = inst.oracle.segment(job, Shape("t4", 1, 2), 0.0, BatchPlan(fixed=32))
    step = 0.010 + 0.002 * 16 + 0.002
    sqr, var = 2.0, 1.0                  # batch 32 lies between the curves of 16 and 64: same stats at epoch 0
    scale = 32 / 16
    gain = (var + sqr) / (var / scale + sqr)
    assert (seg.batch, seg.atomic, seg.accum) == (32, 16, 0)
    assert 1.0 / seg.seconds_per_unit == pytest.approx(gain / step / 1.5)      # calibration 1 / SLOWDOWNS
    assert seg.end_progress == pytest.approx(4500.0)               # the end of epoch 0
    # one GPU past the initial batch accumulates (as the artifact does)
    one = inst.oracle.segment(job, Shape("t4", 1, 1), 0.0, BatchPlan(fixed=64))
    assert (one.atomic, one.accum) == (32, 1)
    # adaptive: the best of the candidate batches, at least as good as any fixed one
    ad = inst.oracle.segment(job, Shape("t4", 1, 2), 0.0, None)
    for b in (16, 32, 64):
        f = inst.oracle.segment(job, Shape("t4", 1, 2), 0.0, BatchPlan(fixed=b))
        assert f is None or ad.seconds_per_unit <= f.seconds_per_unit + 1e-12
    # later epochs: the gradient statistics change, and so does the rate
    later = inst.oracle.segment(job, Shape("t4", 1, 2), 7500.0, BatchPlan(fixed=32))
    assert later.end_progress == pytest.approx(9000.0) and later.seconds_per_unit != seg.seconds_per_unit
    # a GPU type the artifact's cluster does not simulate
    assert inst.oracle.segment(job, Shape("a100-40gb", 1, 1), 0.0) is None


def test_a_job_alone_runs_its_epochs_at_the_oracles_rates():
    from engine.core.reconfig import PRESETS
    from engine.sim.sim_executor import SimExecutor
    from instances.allocation import Allocation
    inst = load_sia_instance("sia:mini/workload-2", SIM)
    job = inst.jobs[0]
    shape = Shape("t4", 1, 4)
    plan = BatchPlan(fixed=64)
    ex = SimExecutor(inst.oracle, PRESETS["sia"](), iteration_noise_cv=0.0)
    ex.launch(job, Allocation(Grid(shape), ((0, 0), (0, 1), (0, 2), (0, 3))), plan, 0.0)
    done = ex.advance(100_000.0)
    assert len(done) == 1
    expect, prog = job.restart_s, 0.0
    while prog < job.progress_target - 1e-9:
        seg = inst.oracle.segment(job, shape, prog, plan)
        end = seg.end_progress if seg.end_progress < job.num_iterations - 1 else job.num_iterations
        expect += (end - prog) * seg.seconds_per_unit
        prog = end
    assert done[0].finished_at_s == pytest.approx(expect, rel=1e-9)


def test_fixed_batch_jobs_keep_their_executor_path():
    """An oracle without ``segment`` runs a job at one rate (the path every built-in
    instance takes); the segment machinery is not entered."""
    from engine.core.reconfig import ReconfigCostModel
    from engine.sim.sim_executor import SimExecutor
    from instances.oracle import TableOracle
    assert SimExecutor(TableOracle(), ReconfigCostModel()).rates_change_with_progress is False
    assert SimExecutor(GoodputOracle(load_sia_instance("sia:mini/workload-2", SIM).oracle.world),
                       ReconfigCostModel()).rates_change_with_progress is True


@pytest.mark.parametrize("edit, where, message", [
    (lambda r: (r / "simulator_config.py").write_text("cluster_nnodes = {'aws': 1}\n"),
     "simulator_config.py", "field 'cluster_ngpus_per_node': missing"),
    (lambda r: (r / "simulator_config.py").write_text(
        (r / "simulator_config.py").read_text().replace('{"aws": 2, "rtx": 1}', '{"aws": 2, "tpu": 1}')),
     "simulator_config.py", "GPU cluster 'tpu' has no GPU type in our catalog"),
    (lambda r: (r / "applications.py").write_text("APPLICATIONS = (\n"),
     "applications.py", "not valid Python"),
    (lambda r: (r / "sia.py").write_text("def other():\n    return 1\n"),
     "sia.py", "no get_restart_penalty function"),
    (lambda r: (r / "traces/toy/placements-aws.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,8,0.02,0\n1,x,0.03,0\n"),
     "placements-aws.csv, line 3, field 'local_bsz'", "must be a whole number in 1..1,048,576, got 'x'"),
    (lambda r: (r / "traces/toy/placements-aws.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n40,8,0.02,0\n"),
     "placements-aws.csv, line 2, field 'placement'", "a node with 0 GPUs"),
    (lambda r: (r / "traces/toy/scalability-rtx.csv").unlink(),
     "scalability-rtx.csv", "scalability profile file not found"),
    (lambda r: (r / "traces/toy/validation-64.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n10,1,0.1,1,1\n5,2,0.2,1,1\n"),
     "validation-64.csv, line 3, field 'progress'", "must increase from one epoch to the next"),
    (lambda r: (r / "workloads/mini/workload-1.csv").write_text(
        "name,time,application,num_replicas,batch_size\ntoy-0,0,resnet,1,16\n"),
     "workload-1.csv, line 2, field 'application'", "unknown application 'resnet'"),
    (lambda r: (r / "workloads/mini/workload-1.csv").write_text(
        "name,time,application,num_replicas,batch_size\ntoy-0,0,toy,0,16\n"),
     "workload-1.csv, line 2, field 'num_replicas'", "must be a whole number in 1..16"),
    (lambda r: (r / "workloads/mini/workload-1.csv").write_text("name,time,application\n"),
     "workload-1.csv, line 1, field 'num_replicas'", "missing column(s) num_replicas, batch_size"),
])
def test_bad_artifact_files_are_named(tmp_path, edit, where, message):
    root = _fresh(_copy(tmp_path))
    edit(root)
    with pytest.raises(InputError) as e:
        load_sia_instance("sia:mini/workload-1", root)
    _fresh(root)
    assert where in str(e.value) and message in str(e.value)


def test_bad_names_and_paths(tmp_path):
    with pytest.raises(InputError, match="field '--sia-artifact': does not exist"):
        artifact_root(tmp_path / "nowhere")
    with pytest.raises(InputError, match="is not the Sia artifact"):
        artifact_root(tmp_path)
    with pytest.raises(InputError, match="give --sia-artifact DIR"):
        load_sia_instance("sia:mini/workload-1", None)
    with pytest.raises(InputError, match=r"no Sia workload 'mini/workload-9'; in mini/: mini/workload-1, "
                                         r"mini/workload-2"):
        load_sia_instance("sia:mini/workload-9", SIM)
    with pytest.raises(InputError, match="bad Sia workload name"):
        load_sia_instance("sia:../x", SIM)
    with pytest.raises(InputError, match="pipeline-parallel"):
        load_sia_instance("sia:pipes/workload-1", SIM)
    assert list_workloads(SIM, "mini") == ["mini/workload-1", "mini/workload-2"]


def test_gpu_types_of_the_artifact_are_in_the_catalog():
    from instances.gpus import get_gpu
    from instances.sia_artifact import SIA_GPU_TYPES
    for t in SIA_GPU_TYPES.values():
        assert get_gpu(t).memory_bytes > 0
    assert get_gpu("t4").fp16_flops < get_gpu("a100-40gb").fp16_flops
    assert math.isfinite(float(np.float64(get_gpu("rtx-2080ti").memory_bw_bytes_per_s)))
