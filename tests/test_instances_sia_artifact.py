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


def _replace(rel: str, old: str, new: str):
    def edit(root: Path) -> None:
        p = root / rel
        text = p.read_text()
        assert old in text, (rel, old)
        p.write_text(text.replace(old, new, 1))
    return edit


CONFIG, APPS, TOY = "simulator_config.py", "applications.py", "traces/toy"
WORKLOAD = "workloads/mini/workload-1.csv"


@pytest.mark.parametrize("case, rel, old, new, where, message", [
    ("A5", CONFIG, 'cluster_nnodes = {"aws": 2, "rtx": 1}', "cluster_nnodes = 10**12",
     "simulator_config.py, line 5, field 'cluster_nnodes'", "its last assignment is a value computed when Python"),
    ("A5", CONFIG, 'cluster_nnodes = {"aws": 2, "rtx": 1}', "cluster_nnodes = dict(aws=2)",
     "simulator_config.py, line 5, field 'cluster_nnodes'", "the importer reads literal values only"),
    ("A5", CONFIG, "SLOWDOWNS = {", 'SLOWDOWNS = {"x": 1.0}\nSLOWDOWNS.update({"toy": 2.0})\nOLD = {',
     "simulator_config.py, line 9, field 'SLOWDOWNS'", "a call of SLOWDOWNS.update(...)"),
    ("A6", CONFIG, '{"aws": 2, "rtx": 1}', '{"aws": 1000000000, "rtx": 1}',
     "simulator_config.py, line 5, field 'cluster_nnodes'", "4,000,000,008 GPUs, more than the 1,048,576"),
    ("A7", CONFIG, '"toy": 1.5', '"toy": 1e-300', "simulator_config.py, line 8, field 'SLOWDOWNS'",
     "entry 'toy': must be a finite number in [0.01, 100]"),
    ("A18", CONFIG, '"toy": 1.5', '"toy": 1e300', "simulator_config.py, line 8, field 'SLOWDOWNS'",
     "past 100 a job runs for simulated years"),
    ("A8", CONFIG, "sia_default_p_val = -0.5", "sia_default_p_val = 0",
     "simulator_config.py, line 12, field 'sia_default_p_val'", "must be a finite number in [-10, 10], not 0"),
    ("A8", CONFIG, "sia_goodput_clip_val = 3000.0", "sia_goodput_clip_val = -5",
     "simulator_config.py, line 13, field 'sia_goodput_clip_val'", "must be a finite number in [1, 1e+09]"),
    ("A8", CONFIG, "sia_default_lambda_n = 1.1", "sia_default_lambda_n = -1e308",
     "simulator_config.py, line 10, field 'sia_default_lambda_n'", "must be a finite number in [-1e+06, 1e+06]"),
    ("A8", CONFIG, "sia_default_lambda_n = 1.1", "sia_default_lambda_n = -2",
     "simulator_config.py, line 10, field 'sia_default_lambda_n'", "lambda_n -2 with p -0.5: lambda_n must be > 1"),
    ("A9", CONFIG, "sia_default_p_val = -0.5", "sia_default_p_val = 1e308",
     "simulator_config.py, line 12, field 'sia_default_p_val'", "got 1e+308"),
    ("A9", CONFIG, "sia_default_lambda_n = 1.1", "sia_default_lambda_n = 1e308",
     "simulator_config.py, line 10, field 'sia_default_lambda_n'", "got 1e+308"),
    ("A10", APPS, "self.rescale_time = 20", "self.rescale_time = 1e300",
     "applications.py, line 11, field 'rescale_time'", "rescale_time of 'toy': must be a finite number in [0, 86400]"),
    ("A11", APPS, "self.rescale_time = 20", "self.rescale_time = 1e999",
     "applications.py, line 11, field 'rescale_time'", "got inf"),
    ("A5", APPS, "self.rescale_time = 20", "self.rescale_time = 2 * 10",
     "applications.py, line 11, field 'rescale_time'", "self.rescale_time of 'toy' is a value computed"),
    ("A12", f"{TOY}/placements-aws.csv", "1,8,0.026000", "1,1000000000000,0.026000",
     "placements-aws.csv, line 2, field 'local_bsz'", "must be a whole number in 1..1,048,576"),
    ("A13", f"{TOY}/placements-aws.csv", "\n1,8,0.026000", "\n" + "1" * 5000 + ",8,0.026000",
     "placements-aws.csv, line 2, field 'placement'", "a placement over 5,000 nodes: at most 18"),
    ("A14", f"{TOY}/validation-16.csv", "5000.0,5000,", "0,5000,",
     "validation-16.csv, line 2, field 'progress'", "must increase from one epoch to the next (and be above 0"),
    ("A15", f"{TOY}/validation-16.csv", "5000.0,5000,0.50,2.0000,1.0000", "5000.0,5000,0.50,1e308,1e308",
     "validation-16.csv, line 2, field 'grad_sqr'", "must be a finite number in [0, 1e+100]"),
    ("step", f"{TOY}/scalability-aws.csv", "1,1,8,0.030800", "1,1,8,1e-300",
     "scalability-aws.csv, line 2, field 'step_time'", "must be a finite number in [1e-06, 3600]"),
    ("A3", WORKLOAD, "toy-0,10,toy,2,32", "toy-0,10,toy,1000000000,32",
     "workload-1.csv, line 2, field 'num_replicas'",
     "must be a whole number in 1..16 (the simulated cluster's 16 GPUs"),
    ("A4", WORKLOAD, "toy-0,10,toy,2,32", "toy-0,10,toy,2,1000000000000",
     "workload-1.csv, line 2, field 'batch_size'", "must be a whole number in 1..1,048,576"),
    ("penalty", "sia.py", "return 20", "return 1e999", "sia.py, line 3, field 'get_restart_penalty'",
     "the penalty of 'toy': must be a finite number in [0, 86400]"),
    ("assert", APPS, 'cluster_suffix="aws", max_epochs=3', 'cluster_suffix="aws", max_epochs=3, max_batch_size=4',
     "workload-1.csv, line 2, field 'application'", "'toy' on 'aws': its largest batch 4 is below its smallest "
                                                     "per-GPU batch 8, so no configuration could run it"),
])
def test_hostile_artifact_values_are_refused_by_file_line_and_field(tmp_path, case, rel, old, new, where, message):
    """Each value that ran (wrongly, for hours, or into a traceback) names where it is."""
    root = _fresh(_copy(tmp_path))
    _replace(rel, old, new)(root)
    with pytest.raises(InputError) as e:
        load_sia_instance("sia:mini/workload-1", root)
    _fresh(root)
    assert where in str(e.value) and message in str(e.value), (case, str(e.value))


def test_a_validation_file_named_past_the_batch_bound_is_refused(tmp_path):
    root = _fresh(_copy(tmp_path))
    (root / TOY / "validation-16.csv").rename(root / TOY / "validation-99999999999999999999.csv")   # A16
    with pytest.raises(InputError, match=r"validation-99999999999999999999\.csv, field 'batch size': the batch "
                                         r"size its name gives must be a whole number in 1\.\.1,048,576"):
        load_sia_instance("sia:mini/workload-1", root)
    _fresh(root)


@pytest.mark.parametrize("rel", [CONFIG, APPS, "sia.py", f"{TOY}/placements-aws.csv", f"{TOY}/validation-16.csv",
                                 WORKLOAD])
def test_a_pipe_or_a_link_loop_in_place_of_an_artifact_file_is_named(tmp_path, rel):
    """A1 (blocked forever), A2 (an OSError traceback): refused by name, unread."""
    import os
    for kind in ("fifo", "loop"):
        root = _fresh(_copy(tmp_path / kind))
        p = root / rel
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
            want = "not a regular file (a pipe, a device or a socket)"
        else:
            os.symlink(p.name + ".b", p)
            os.symlink(p.name, str(p) + ".b")
            want = "Too many levels of symbolic links"
        with pytest.raises(InputError) as e:
            load_sia_instance("sia:mini/workload-1", root)
        _fresh(root)
        assert e.value.file == str(p) and want in str(e.value)


def test_a_workload_name_longer_than_a_file_name_is_refused_without_echoing_it():
    with pytest.raises(InputError) as e:                    # A17: was "File name too long" (an OSError)
        load_sia_instance("sia:" + "x" * 5000 + "/w", SIM)
    assert e.value.field == "--instance" and "(5,002 characters): a part of it is longer than a file name may be" \
        in str(e.value) and len(str(e.value)) < 300
