"""Simulator against hand-computed cases: exact JCTs, round alignment, downtime, preemption,
infeasible decisions, never-placed jobs, determinism."""
from __future__ import annotations

import pytest

from engine.core.policy import make_policy
from engine.core.reconfig import ReconfigCostModel
from engine.sim.metrics import TIMING_KEYS, never_placed_lines
from engine.sim.simulator import simulate
from tests.test_engine_helpers import Inst, LinearOracle, ScriptedPolicy, cluster, grid, job

A100 = "a100-40gb"


def _grow_when_alone(ctx):
    """A: 1x2 when queued; grows to 1x4 once no other job is active. B: 1x2."""
    out = {}
    for v in ctx.jobs:
        if v.job_id == "A":
            if v.current is None:
                out["A"] = grid("a100", 1, 2)
            elif len(ctx.jobs) == 1:
                out["A"] = grid("a100", 1, 4)
            else:
                out["A"] = v.current.grid
        else:
            out[v.job_id] = v.current.grid if v.current else grid("a100", 1, 2)
    return out


def test_two_jobs_hand_computed_with_round_alignment_and_reconfiguration():
    # 4 A100s on one node; iteration time = 10 s / GPUs; reconfig 10 s per GPU (cap 40 s),
    # charged at launch too.
    # A: arrives 0, 1000 iterations. Round 0 (t=0): launch on 2 GPUs, 20 s downtime, 5 s/iter.
    # B: arrives 10 -> submitted at round 1 (t=300): 2 GPUs, 20 s downtime, 100 x 5 s -> ends 820.
    # Round 3 (t=900): A alone -> grows to 4 GPUs. Progress by 900: (900-20)/5 = 176 iters;
    #   40 s downtime, then 824 x 2.5 s = 2060 s -> A ends at 900 + 40 + 2060 = 3000.
    inst = Inst("hand", cluster(("a100", 1, 4)), (job("A", 0.0, 1000), job("B", 10.0, 100)), LinearOracle(10.0))
    pol = ScriptedPolicy(_grow_when_alone)
    res = simulate(inst, pol, rounds=20, reconfig=ReconfigCostModel())
    by = {j.job_id: j for j in res.jobs}
    assert by["B"].submitted_s == 300.0 and by["B"].first_start_s == 300.0
    assert by["B"].finish_s == pytest.approx(820.0)
    assert by["B"].jct_s == pytest.approx(810.0)
    assert by["A"].finish_s == pytest.approx(3000.0)
    assert by["A"].reconfigurations == 1 and by["B"].reconfigurations == 0
    s = res.summary
    assert s["jobs_finished"] == 2 and s["jobs_never_placed"] == 0
    assert s["avg_jct_s"] == pytest.approx((3000.0 + 810.0) / 2)
    assert s["makespan_s"] == pytest.approx(3000.0)
    assert s["avg_queueing_delay_s"] == pytest.approx((0.0 + 290.0) / 2)
    assert s["reconfigurations"] == 1
    assert s["reconfig_gpu_hours_lost"] == pytest.approx(40.0 * 4 / 3600.0)
    assert by["A"].launch_lost_gpu_s == pytest.approx(20.0 * 2)
    # throughput of round 0: A computes 280 s at 8 samples / 5 s
    assert res.rounds[0].throughput_samples_per_s == pytest.approx(280.0 * 8 / 5 / 300.0)
    # round 1: A computes all 300 s (1.6/s), B 280 s (1.6/s)
    assert res.rounds[1].throughput_samples_per_s == pytest.approx((300 * 1.6 + 280 * 1.6) / 300.0)
    assert s["peak_throughput"] == pytest.approx(max(r.throughput_samples_per_s for r in res.rounds[:20]))
    # the policy saw B only from round 1, and A's remaining work as it progressed
    assert [len(c.jobs) for c in pol.seen[:4]] == [1, 2, 2, 1]
    assert pol.seen[1].job("A").remaining_iterations == pytest.approx(1000 - 56)
    # measured as a real job would be: the mean of A's 56 iterations so far, each the true 5 s
    # times a log-normal factor of CV 5% (so within ~3 standard deviations of 5 s)
    assert pol.seen[1].job("A").measured_iteration_time_s == pytest.approx(5.0, rel=0.02)
    assert pol.seen[1].job("A").measured_iteration_time_s != 5.0
    # GPU utilization over the active span (the last job ends at 3000 s, the end of round 9;
    # rounds 10-19 are an idle tail): GPU-seconds held / (4 GPUs x 3000 s)
    held = 2 * 900 + 4 * (3000 - 900) + 2 * (820 - 300)
    assert s["active_span_s"] == pytest.approx(3000.0)
    assert s[f"gpu_util_{A100}"] == pytest.approx(held / (4 * 3000.0))
    assert s["avg_throughput"] == pytest.approx(sum(r.throughput_samples_per_s for r in res.rounds[:10]) / 10)
    # the same figures whether or not the run is run out (one definition for simulate and bench)
    ran_out = simulate(inst, ScriptedPolicy(_grow_when_alone), rounds=20, run_out=True,
                       reconfig=ReconfigCostModel()).summary
    for key in ("avg_throughput", "gpu_util", f"gpu_util_{A100}", "active_span_s"):
        assert ran_out[key] == pytest.approx(s[key])
    assert s["end_reason"] == "horizon" and ran_out["end_reason"] == "all jobs finished"


def test_downtime_longer_than_a_round_carries_over():
    # restart_s = 500 s: the job launched at t=0 computes from t=520 (520 = 20 + 500).
    inst = Inst("carry", cluster(("a100", 1, 2)), (job("A", 0.0, 100),), LinearOracle(10.0))
    pol = ScriptedPolicy(lambda ctx: {v.job_id: grid("a100", 1, 2) for v in ctx.jobs})
    res = simulate(inst, pol, rounds=10, reconfig=ReconfigCostModel(restart_s=500.0))
    assert res.jobs[0].finish_s == pytest.approx(520.0 + 100 * 5.0)
    assert res.rounds[0].throughput_samples_per_s == 0.0
    assert res.rounds[1].throughput_samples_per_s == pytest.approx(80 * 1.6 / 300.0)


def test_preempted_job_resumes_with_its_progress():
    # A runs on 2 GPUs in round 0, is stopped in round 1, resumed in round 2 (no downtime).
    def rule(ctx):
        return {} if ctx.round_index == 1 else {v.job_id: grid("a100", 1, 2) for v in ctx.jobs}
    inst = Inst("preempt", cluster(("a100", 1, 2)), (job("A", 0.0, 100),), LinearOracle(10.0))
    res = simulate(inst, ScriptedPolicy(rule), rounds=10,
                   reconfig=ReconfigCostModel(replan_per_gpu_s=0.0, replan_cap_s=0.0))
    a = res.jobs[0]
    # 60 iterations in [0, 300), none in [300, 600), 40 more from 600 -> 800
    assert a.finish_s == pytest.approx(800.0)
    assert a.preemptions == 1 and a.launches == 2 and a.reconfigurations == 1
    assert res.summary["preemptions"] == 1 and res.summary["reconfigurations"] == 1
    assert a.attained_gpu_s == pytest.approx(2 * 300 + 2 * 200)


def test_infeasible_decision_is_dropped_counted_and_reported_to_the_policy():
    bad = grid("a100", 1, 4).shape
    oracle = LinearOracle(10.0, infeasible={bad})
    def rule(ctx):
        return {v.job_id: grid("a100", 1, 2) if bad in v.known_infeasible_shapes else grid("a100", 1, 4)
                for v in ctx.jobs}
    pol = ScriptedPolicy(rule)
    inst = Inst("inf", cluster(("a100", 1, 4)), (job("A", 0.0, 60),), oracle)
    res = simulate(inst, pol, rounds=5, reconfig=ReconfigCostModel(charge_launch=False))
    assert res.rounds[0].infeasible_drops == 1 and res.rounds[0].launches == 0
    assert res.rounds[1].launches == 1
    assert res.jobs[0].first_start_s == 300.0
    assert res.jobs[0].finish_s == pytest.approx(300.0 + 60 * 5.0)
    assert res.summary["infeasible_drops"] == 1


def test_never_placed_jobs_are_reported_not_dropped():
    # "X" is infeasible on every shape; with run-out the safety stop ends the run and X
    # is still counted, as never placed.
    inst = Inst("never", cluster(("a100", 1, 4)), (job("A", 0.0, 100, gpus=2), job("X", 0.0, 100, gpus=2)),
                LinearOracle(10.0, infeasible={"X"}))
    res = simulate(inst, make_policy("fcfs"), rounds=3, run_out=True)
    s = res.summary
    assert s["jobs_total"] == 2 and s["jobs_never_placed"] == 1
    assert s["jobs_finished_runout"] == 1 and s["jobs_unfinished_runout"] == 1
    assert s["stopped_by_safety"] is True
    x = next(j for j in res.jobs if j.job_id == "X")
    assert x.status == "queued" and x.first_start_s is None and x.infeasible_drops == 1


def test_job_requesting_a_missing_gpu_type_is_never_placed():
    inst = Inst("missing", cluster(("a100", 1, 4)),
                (job("A", 0.0, 10, gpus=1), job("V", 0.0, 10, gpus=1, gtype="v100")),
                LinearOracle(10.0))
    res = simulate(inst, make_policy("fcfs"), rounds=5)
    assert res.summary["jobs_never_placed"] == 1 and res.summary["jobs_finished"] == 1
    # named, with the reason, for stderr and jobs.csv; counted by reason in the summary
    assert res.summary["never_placed_reasons"] == "gpu type missing: 1"
    v = next(j for j in res.jobs if j.job_id == "V")
    assert "v100-32gb" in v.never_placed_reason and "lacks" in v.never_placed_reason
    lines = never_placed_lines(res)
    assert len(lines) == 2 and lines[1].startswith("  job V ") and "lacks" in lines[1]


def test_run_out_safety_limit_stops_and_is_reported():
    inst = Inst("long", cluster(("a100", 1, 4)), (job("A", 0.0, 10**6, gpus=1),), LinearOracle(10.0))
    res = simulate(inst, make_policy("fcfs"), rounds=3, run_out=True, max_rounds=50)
    s = res.summary
    assert s["stopped_by_safety"] is True and s["end_reason"] == "safety limit"
    assert s["safety_limit_rounds"] == 50 and len(res.rounds) == 50
    assert s["jobs_unfinished_runout"] == 1


def test_run_out_metrics_cover_jobs_after_the_horizon():
    jobs = (job("A", 0.0, 30, gpus=1), job("B", 5000.0, 30, gpus=1))
    inst = Inst("ro", cluster(("a100", 1, 1)), jobs, LinearOracle(10.0))
    res = simulate(inst, make_policy("fcfs"), rounds=2, run_out=True,
                   reconfig=ReconfigCostModel(charge_launch=False))
    s = res.summary
    # A: 0 -> 300. B arrives at 5000, submitted at round 17 (5100), ends at 5400.
    assert s["jobs_finished"] == 1 and s["avg_jct_s"] == pytest.approx(300.0)
    assert s["jobs_finished_runout"] == 2
    assert s["avg_jct_runout_s"] == pytest.approx((300.0 + 400.0) / 2)
    assert s["makespan_runout_s"] == pytest.approx(5400.0)


def test_same_seed_same_summary_and_no_job_lost():
    from instances.builtin import get_instance
    inst = get_instance("demo", 0)
    a = simulate(inst, make_policy("fcfs"), rounds=60, seed=3).summary
    b = simulate(inst, make_policy("fcfs"), rounds=60, seed=3).summary
    strip = lambda s: {k: v for k, v in s.items() if k not in TIMING_KEYS}
    assert strip(a) == strip(b)
    assert a["jobs_total"] == len(inst.jobs)
    assert a["jobs_finished"] > 0


def test_bad_decisions_raise():
    inst = Inst("bad", cluster(("a100", 1, 2)), (job("A", 0.0, 10),), LinearOracle())
    with pytest.raises(ValueError, match="unknown"):
        simulate(inst, ScriptedPolicy(lambda ctx: {"nope": grid("a100", 1, 1)}), rounds=2)
    with pytest.raises(ValueError):
        ReconfigCostModel(replan_per_gpu_s=-1.0)


def test_reconfig_cost_model_terms():
    from engine.core.allocation import Allocation
    j = job("A", 0.0, 10)
    g2, g8 = grid("a100", 1, 2), grid("a100", 1, 8)
    a = Allocation(g2, ((0, 0), (0, 1)))
    b = Allocation(g2, ((0, 2), (0, 3)))
    c = Allocation(g8, tuple((0, i) for i in range(8)))
    m = ReconfigCostModel()
    assert m.cost_s(j, a, a) == 0.0
    assert m.cost_s(j, a, b) == 20.0
    assert m.cost_s(j, a, c) == 40.0                  # capped
    assert m.cost_s(j, None, a) == 20.0
    assert ReconfigCostModel(charge_launch=False).cost_s(j, None, a) == 0.0
    assert ReconfigCostModel(restart_s=7.0).cost_s(j, a, b) == 27.0
    bw = 1e9
    state = j.arch.param_count * 16.0
    from estimators.move_cost import MoveCostParams
    mp = MoveCostParams(drain_s=1.0, startup_s=20.0, regroup_s=2.0, warmup_s=3.0, d2d_bytes_per_s=bw,
                        storage_bytes_per_s=bw / 10, stop_s=0.5)
    sm = ReconfigCostModel(replan_per_gpu_s=0.0, replan_cap_s=0.0, moves=mp, state_path="storage")
    assert sm.cost_s(j, None, a) == pytest.approx(20.0 + 3.0)                  # a first start moves no state
    through = 1.0 + 0.5 + 20.0 + 3.0 + state * 3 / (bw / 10)                  # one copy written, two read (dp=2)
    assert sm.cost_s(j, a, b) == pytest.approx(through)
    assert sm.cost_s(j, None, a, resumed=True) == pytest.approx(through)       # a resume comes back from storage
    # device to device: only the bytes that change owner; running ranks regroup unless it grows
    dm = ReconfigCostModel(replan_per_gpu_s=0.0, replan_cap_s=0.0, moves=mp, state_path="d2d")
    grow = Allocation(grid("a100", 1, 4), ((0, 0), (0, 1), (0, 2), (0, 3)))
    assert dm.cost_s(j, a, grow) == pytest.approx(1.0 + 20.0 + 3.0 + 2 * state / bw)   # two new replicas
    assert dm.cost_s(j, a, b) == pytest.approx(1.0 + 2.0 + 3.0 + 2 * state / bw)       # nothing kept
    assert dm.cost_to_grid_s(j, a, grow.grid) == pytest.approx(dm.cost_s(j, a, grow))  # prices keeping GPUs
    # without a move-cost model the price skips building the nominal allocation: the same figures
    from engine.core.reconfig import nominal_allocation
    for model in (m, ReconfigCostModel(charge_launch=False), ReconfigCostModel(restart_s=7.0, replan_cap_s=25.0)):
        for old in (None, a, b, c):
            for g in (g2, g8, grid("a100", 2, 2), grid("a40", 1, 4)):
                for resumed in (False, True):
                    if old is not None and old.grid == g:
                        assert model.cost_to_grid_s(j, old, g, resumed) == 0.0
                        continue
                    new = nominal_allocation(g)
                    if old is not None and old.grid.gpu_type == g.gpu_type:
                        n = min(len(old.gpus), len(new.gpus))
                        new = Allocation(g, old.gpus[:n] + new.gpus[n:])
                    assert model.cost_to_grid_s(j, old, g, resumed) == model.cost_s(j, old, new, resumed)
    with pytest.raises(ValueError, match="unknown"):
        ReconfigCostModel.from_options({"nope": 1})
    with pytest.raises(ValueError, match="preset"):
        ReconfigCostModel.from_options({"preset": "nope"})
    with pytest.raises(ValueError, match="move-cost model"):
        ReconfigCostModel.from_options({"startup_s": 5})
    real = ReconfigCostModel.from_options({"preset": "realistic", "startup_s": 12})
    assert real.preset == "realistic" and real.moves.startup_s == 12 and real.state_path == "d2d"
    assert ReconfigCostModel.from_options({"preset": "local"}).moves == MoveCostParams.measured_here()


def test_running_job_whose_new_grid_does_not_fit_keeps_its_gpus():
    # A runs on 2 of 4 GPUs; B takes the other 2; in round 2 A asks for 4 GPUs, which do
    # not fit: a packing failure, and A keeps running on its 2 GPUs (not preempted).
    def rule(ctx):
        out = {}
        for v in ctx.jobs:
            if v.job_id == "A":
                out["A"] = grid("a100", 1, 4) if ctx.round_index >= 2 else grid("a100", 1, 2)
            else:
                out[v.job_id] = grid("a100", 1, 2)
        return out
    inst = Inst("stuck", cluster(("a100", 1, 4)), (job("A", 0.0, 1000), job("B", 0.0, 1000)), LinearOracle(10.0))
    res = simulate(inst, ScriptedPolicy(rule), rounds=4, reconfig=ReconfigCostModel(charge_launch=False))
    assert res.rounds[2].packing_failures == 1 and res.rounds[2].preemptions == 0
    a = next(j for j in res.jobs if j.job_id == "A")
    assert a.preemptions == 0 and a.reconfigurations == 0 and a.packing_failures == 2
    assert a.iterations_done == pytest.approx(4 * 300 / 5.0)


def test_jobs_displaced_by_a_truth_rejected_move_are_not_packing_failures():
    # A runs on the 4 A100s; when B arrives the policy moves A to the 2 A10s (which the
    # truth rejects for A) and gives B the A100s. As decided, everything packs; after
    # the drop A keeps its A100s, so B waits: displaced, not a packing failure.
    a10 = grid("a10", 1, 2)
    oracle = LinearOracle(10.0, infeasible={("A", a10.shape)})

    def rule(ctx):
        ids = {v.job_id for v in ctx.jobs}
        a = next((v for v in ctx.jobs if v.job_id == "A"), None)
        if "B" not in ids:
            return {"A": grid("a100", 1, 4)} if a is not None else {}
        if a is None:
            return {"B": grid("a100", 1, 4)}
        if a10.shape in a.known_infeasible_shapes:
            return {"A": a.current.grid, "B": a10}
        return {"A": a10, "B": grid("a100", 1, 4)}

    inst = Inst("displaced", cluster(("a100", 1, 4), ("a10", 1, 2)),
                (job("A", 0.0, 10_000), job("B", 10.0, 100)), oracle)
    res = simulate(inst, ScriptedPolicy(rule), rounds=4, reconfig=ReconfigCostModel(charge_launch=False))
    r1 = res.rounds[1]
    assert r1.infeasible_drops == 1
    assert r1.displaced == 1 and r1.packing_failures == 0
    assert res.summary["packing_failures"] == 0 and res.summary["displaced_by_drops"] == 1
    assert res.rounds[2].launches == 1          # B starts on the A10s next round
