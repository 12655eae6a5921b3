"""The JCT lower bound (instances/bounds.py) and `arena bench bound`."""
from __future__ import annotations

import json
import math

import pytest

from engine.cli.common import build_perf
from engine.cli.main import main
from engine.core.policy import make_policy
from engine.sim.metrics import write_result
from engine.sim.simulator import simulate
from instances.bounds import cluster_shapes, jct_lower_bounds
from instances.builtin import get_instance
from instances.grid import Shape
from tests.test_engine_helpers import Inst, LinearOracle, cluster, job
from tests.test_move_ledger import assert_ledger_consistent


def test_cluster_shapes_are_the_engines_power_of_two_shapes():
    spec = cluster(("a100", 3, 4), ("a40", 8, 2))
    shapes = set(cluster_shapes(spec, 8))
    assert Shape("a100-40gb", 2, 4) in shapes and Shape("a100-40gb", 1, 4) in shapes
    assert Shape("a100-40gb", 4, 2) not in shapes                 # 4 nodes of a100: there are 3
    assert Shape("a100-40gb", 3, 4) not in shapes                 # 12 GPUs: not a power of two
    assert Shape("a40", 4, 2) in shapes and Shape("a40", 8, 1) in shapes
    assert Shape("a40", 8, 2) not in shapes                       # 16 GPUs > max_gpus
    assert all(s.num_gpus <= 8 for s in shapes)
    with pytest.raises(ValueError):
        cluster_shapes(spec, 0)


def test_bound_is_the_fastest_shape_from_the_next_round():
    spec = cluster(("a100", 2, 4))
    oracle = LinearOracle(work_s=8.0, infeasible={Shape("a100-40gb", 2, 4)})   # 8 GPUs: infeasible
    jobs = (job("A", 0.0, 100), job("B", 450.0, 10, gpus=3))
    a, b = jct_lower_bounds(jobs, spec, oracle, round_interval_s=300.0, max_gpus=8)
    assert a.fastest == Shape("a100-40gb", 1, 4) and a.wait_s == 0.0
    assert a.bound_s == pytest.approx(100 * 8.0 / 4)
    # B arrives at 450: the next round is at 600; it asked for 3 GPUs, fewer than 4
    assert b.wait_s == pytest.approx(150.0) and b.bound_s == pytest.approx(150.0 + 10 * 8.0 / 4)
    # with at most 2 GPUs, its requested shape (3 GPUs on one node) is the fastest
    b2 = jct_lower_bounds(jobs, spec, oracle, round_interval_s=300.0, max_gpus=2)[1]
    assert b2.fastest == Shape("a100-40gb", 1, 3) and b2.bound_s == pytest.approx(150.0 + 10 * 8.0 / 3)
    none = jct_lower_bounds((job("C", 0.0, 5),), spec, LinearOracle(infeasible={"C"}), round_interval_s=300.0)[0]
    assert none.fastest is None and math.isinf(none.bound_s)


@pytest.mark.parametrize("policy", ["fcfs", "arena", "sia-ap"])
def test_no_policy_finishes_a_job_before_its_bound(policy):
    """With the simulator's iteration noise off, every job's JCT is at least its bound,
    and the bound is tight somewhere (some job runs alone at its fastest shape)."""
    inst = get_instance("demo", 0)
    perf = None if policy == "fcfs" else build_perf(None, policy, None, None, inst.oracle.training_runtime)
    res = simulate(inst, make_policy(policy), perf=perf, run_out=True, iteration_noise_cv=0.0)
    bounds = {b.job_id: b.bound_s for b in jct_lower_bounds(inst.jobs, inst.cluster, inst.oracle,
                                                            round_interval_s=inst.round_interval_s)}
    finished = [j for j in res.jobs if j.finish_s is not None]
    assert len(finished) == len(inst.jobs)
    for j in finished:
        assert j.finish_s - j.arrival_s >= bounds[j.job_id] - 1e-6, j.job_id
    assert min((j.finish_s - j.arrival_s) / bounds[j.job_id] for j in finished) < 1.5
    assert_ledger_consistent(res)           # the same run's move ledger (tests/test_move_ledger.py)
    assert (len(res.moves) > 0) == (policy != "fcfs")


def test_report_reads_runs_and_refuses_foreign_ones(tmp_path, capsys):
    inst = get_instance("demo", 0)
    res = simulate(inst, make_policy("fcfs"), run_out=True)
    write_result(res, tmp_path / "fcfs")
    png = tmp_path / "bound.png"
    assert main(["bench", "bound", "--instance", "demo", str(tmp_path / "fcfs"), "--json", "--plot", str(png)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 0
    run = rep["runs"][str(tmp_path / "fcfs")]
    assert run["unfinished"] == 0
    assert run["avg_jct_s"] == pytest.approx(res.summary["avg_jct_runout_s"])
    assert run["ratio_to_bound"] >= 1.0
    assert sum(run["class_share_s"].values()) == pytest.approx(run["avg_jct_s"])
    assert sum(c["jobs"] for c in rep["classes"]) == rep["jobs"] == len(inst.jobs)
    # a directory without jobs.csv, and a run of another workload
    assert main(["bench", "bound", "--instance", "demo", str(tmp_path)]) == 2
    assert "no jobs.csv" in capsys.readouterr().err
    other = Inst("other", cluster(("a100", 1, 4)), (job("X", 0.0, 10),), LinearOracle())
    write_result(simulate(other, make_policy("fcfs"), run_out=True), tmp_path / "other")
    assert main(["bench", "bound", "--instance", "demo", str(tmp_path / "other")]) == 2
    assert "not a run of this workload" in capsys.readouterr().err



COLUMNS = ("job_id", "model", "global_batch", "num_iterations", "arrival_s", "deadline_s", "priority", "tenant",
           "requested_gpu_type", "requested_gpus")
ROWS = (("1", "gpt__1.3B", "32", "1000", "0", "", "1", "default", "", ""),
        ("2", "gpt__1.3B", "32", "2000", "100", "", "1", "default", "", ""))


def trace(rows) -> str:
    return "# arena-trace v1\n" + ",".join(COLUMNS) + "\n" + "".join(",".join(r) + "\n" for r in rows)


@pytest.mark.parametrize("field, value", [("num_iterations", "50000"), ("model", "gpt__2.6B"),
                                          ("global_batch", "64"), ("arrival_s", "30.5"),
                                          ("requested_gpus", "4")])
def test_a_run_of_another_trace_with_the_same_job_ids_is_refused_naming_the_job_and_field(tmp_path, capsys,
                                                                                           field, value):
    # a run is judged only against the workload it ran: the same ids with other work are another workload
    (tmp_path / "c.json").write_text('{"node_groups": [{"gpu_type": "a100", "num_nodes": 2, "gpus_per_node": 4}]}')
    (tmp_path / "a.csv").write_text(trace(ROWS))
    changed = list(ROWS[1])
    changed[COLUMNS.index(field)] = value
    (tmp_path / "b.csv").write_text(trace((ROWS[0], changed)))
    workload = ["--cluster", str(tmp_path / "c.json"), "--trace"]
    run = str(tmp_path / "run")
    assert main(["simulate", *workload, str(tmp_path / "a.csv"), "--policy", "fcfs", "--run-out", "--quiet",
                 "--no-plots", "--out", run]) == 0
    capsys.readouterr()
    assert main(["bench", "bound", *workload, str(tmp_path / "a.csv"), run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][run]["unfinished"] == 0
    assert main(["bench", "bound", *workload, str(tmp_path / "b.csv"), run]) == 2
    err = capsys.readouterr().err
    was = {"arrival_s": "100.0", "requested_gpus": "none"}.get(field, ROWS[1][COLUMNS.index(field)])
    assert f"arena: error: {run}/jobs.csv, line 3, field '{field}': not a run of this workload: job '2' has " \
           f"{field} {was} in this run, {value} in the workload" in err, err
    assert "bounds of" not in err                       # refused before the bounds' work
