"""fcfs: requested shapes, order, backfilling, blocking scopes, no preemption."""
from __future__ import annotations

import pytest

from engine.core.policy import make_policy
from engine.core.reconfig import ReconfigCostModel
from engine.sim.simulator import simulate
from instances.grid import Shape
from tests.test_engine_helpers import Inst, LinearOracle, cluster, job

NO_COST = ReconfigCostModel(charge_launch=False)


def _jobs():
    # A (2 GPUs) runs from 0 to 600; B (4 GPUs) cannot fit until A ends; C (2 GPUs) fits beside A.
    return (job("A", 0.0, 240, gpus=2), job("B", 1.0, 120, gpus=4), job("C", 2.0, 60, gpus=2))


def _starts(res):
    return {j.job_id: j.first_start_s for j in res.jobs}


def test_backfill_lets_a_later_job_start():
    res = simulate(Inst("bf", cluster(("a100", 1, 4)), _jobs(), LinearOracle(5.0)), make_policy("fcfs"),
                   rounds=20, reconfig=NO_COST)
    # A: 240 x 2.5 s = 600 s. C backfills at 300 and ends at 300 + 60 x 2.5 = 450.
    # B waits for A and C: starts at round 2 (600), 120 x 1.25 s -> 750.
    assert _starts(res) == {"A": 0.0, "B": 600.0, "C": 300.0}
    assert res.summary["jobs_finished"] == 3


def test_without_backfill_the_head_blocks():
    res = simulate(Inst("nobf", cluster(("a100", 1, 4)), _jobs(), LinearOracle(5.0)),
                   make_policy("fcfs", backfill=False), rounds=20, reconfig=NO_COST)
    # B (head) blocks C; B starts when A ends (600), ends at 750; then C at 900.
    assert _starts(res) == {"A": 0.0, "B": 600.0, "C": 900.0}


def test_block_scope_gpu_type_blocks_only_the_same_type():
    jobs = _jobs() + (job("D", 3.0, 10, gpus=2, gtype="a40"),)
    inst = Inst("scope", cluster(("a100", 1, 4), ("a40", 1, 2)), jobs, LinearOracle(5.0))
    res = simulate(inst, make_policy("fcfs", backfill=False, block_scope="gpu_type"), rounds=20, reconfig=NO_COST)
    st = _starts(res)
    assert st["D"] == 300.0 and st["C"] == 900.0
    res = simulate(inst, make_policy("fcfs", backfill=False), rounds=20, reconfig=NO_COST)
    assert _starts(res)["D"] > 300.0


def test_running_jobs_are_never_preempted_and_default_request():
    jobs = (job("A", 0.0, 1000, gpus=4), job("N", 1.0, 10))          # N asks for nothing
    res = simulate(Inst("np", cluster(("a100", 1, 4)), jobs, LinearOracle(5.0)), make_policy("fcfs"),
                   rounds=30, reconfig=NO_COST)
    a, n = res.jobs
    assert a.preemptions == 0 and a.reconfigurations == 0
    assert n.first_start_s == pytest.approx(1500.0)                    # after A: 1000 x 1.25 s
    assert n.last_grid == "a100-40gb:1x1:pp1"                          # default: 1 GPU of the largest type


def test_compact_shape_and_options():
    spec = cluster(("a100", 4, 4))
    assert spec.fewest_nodes_shape("a100-40gb", 2) == Shape("a100-40gb", 1, 2)
    assert spec.fewest_nodes_shape("a100-40gb", 8) == Shape("a100-40gb", 2, 4)
    assert spec.fewest_nodes_shape("a100-40gb", 6) == Shape("a100-40gb", 2, 3)
    assert spec.fewest_nodes_shape("a100-40gb", 32) is None
    assert spec.fewest_nodes_shape("a40", 1) is None
    with pytest.raises(ValueError, match="unknown"):
        make_policy("fcfs", nope=1)
    with pytest.raises(ValueError):
        make_policy("fcfs", block_scope="rack")
