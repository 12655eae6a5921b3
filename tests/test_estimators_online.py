"""The ``online`` performance model: its correction rule, the round loop's feed, the
per-job estimate memo of the round data, and convergence in the simulator through
measured (noisy) iteration times only."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.context import JobView, RoundContext
from engine.core.executor import JobProgress
from engine.core.online_feed import OnlineFeed
from engine.core.reconfig import ReconfigCostModel
from engine.decide.formulation.round_data import RoundDataCache, build_round_data
from engine.sim.simulator import simulate
from estimators import LearnsOnline, make_performance_model
from estimators.base import EstimatesInBulk
from estimators.online import SHARED_WINDOW, ObservationStore, OnlineModel, OnlinePrior
from estimators.perf import DpOnlyTwin
from instances.allocation import Allocation
from instances.errors import InputError
from instances.grid import Grid, Shape
from instances.jobs import Job
from tests.test_engine_helpers import Inst, LinearOracle, ScriptedPolicy, cluster

A100 = "a100-40gb"
JOB = Job("j", "gpt__1.3B", 128, 1000, 0.0)
G2 = Grid(Shape(A100, 1, 2), 1)
G4 = Grid(Shape(A100, 1, 4), 1)
G4PP2 = Grid(Shape(A100, 1, 4), 2)
CPU1 = Grid(Shape("cpu", 1, 1), 1)
CPU2 = Grid(Shape("cpu", 1, 2), 1)
OWN_ONLY = OnlinePrior(shape=0.229, shared_shape=0.0, shared_family=0.0, shared_model=0.0)   # no cross-job


@pytest.fixture(scope="module")
def base():
    return make_performance_model("analytic")


def online(base, **kw) -> OnlineModel:
    return OnlineModel(base=base, **kw)


def test_registered_kind_with_analytic_base_by_default(monkeypatch, tmp_path):
    monkeypatch.setenv("ARENA_LEARNED_ARTIFACT", str(tmp_path / "none.joblib"))   # no learned artifact
    m = make_performance_model("online")
    assert m.kind == "online" and m.base_kind == "analytic" and m.name == "online(analytic)"
    assert isinstance(m, LearnsOnline)
    assert not isinstance(make_performance_model("analytic"), LearnsOnline)
    with pytest.raises(InputError):
        make_performance_model("online", base="online")
    with pytest.raises(InputError):
        make_performance_model("online", prior={"job": -1.0})
    with pytest.raises(InputError):
        make_performance_model("online").observe(JOB, G2, 0.0, 5)
    with pytest.raises(InputError):
        make_performance_model("online").observe("j", G2, 1.0, 5)          # a Job, not its id
    with pytest.raises(InputError):
        OnlineModel(base=make_performance_model("analytic"), min_iterations=10, store=ObservationStore(20))


def test_without_observations_the_base_estimate(base):
    m = online(base)
    assert m.estimate(JOB, G2) == base.estimate(JOB, G2)
    assert m.estimate_key(JOB) is None
    m.observe(Job("other", JOB.model, 64, 10, 0.0), G2, 1.0, 30)   # another job's run on G2's shape
    assert m.estimate(JOB, G4) == base.estimate(JOB, G4)          # says nothing of another shape
    assert m.estimate_key(JOB) is None


def test_own_grid_is_the_observed_mean_after_enough_iterations(base):
    m = online(base)
    b = base.estimate(JOB, G2).iteration_time_s
    m.observe(JOB, G2, 2.0 * b, 10)
    m.observe(JOB, G2, 4.0 * b, 10)                         # 20 iterations, mean 3x the base
    e = m.estimate(JOB, G2)
    assert e.iteration_time_s == pytest.approx(3.0 * b) and e.source.endswith("/observed")
    assert e.throughput == pytest.approx(JOB.global_batch / (3.0 * b))


def test_fewer_iterations_are_shrunk_towards_the_base(base):
    b = base.estimate(JOB, G2).iteration_time_s
    est = []
    for n in (1, 4, 16):
        m = online(base, min_iterations=1000)
        m.observe(JOB, G2, 2.0 * b, n)
        est.append(m.estimate(JOB, G2).iteration_time_s / b)
    assert 1.0 < est[0] < est[1] < est[2] < 2.0


def _hand_prediction(m: OnlineModel, obs_grid: Grid, n: float, x: float, target: Grid) -> float:
    """One observation: posterior mean = cov(target, obs) / (var(obs) + noise) * x, with
    the prior's parts written out here rather than taken from the model."""
    p = m.prior
    s0, s1 = m.comm_share(JOB, obs_grid), m.comm_share(JOB, target)

    def t(gt):
        return p.type if gt in m.calibrated_types else p.new_type
    shape = p.shape ** 2 + p.shared_shape ** 2 + p.shared_family ** 2 + p.shared_model ** 2   # no other job ran
    cov = p.job ** 2 + p.comm ** 2 * s0 * s1 + (t(target.gpu_type) ** 2 if target.gpu_type == obs_grid.gpu_type
                                                else 0.0) + (shape if target.shape == obs_grid.shape else 0.0)
    var = p.job ** 2 + p.comm ** 2 * s0 * s0 + t(obs_grid.gpu_type) ** 2 + shape + p.grid ** 2
    return cov / (var + math.log1p(p.iteration_cv ** 2) / n) * x


@pytest.mark.parametrize("target,moves", [(G4, True), (G4PP2, True), (Grid(Shape("a40", 1, 2), 1), False)])
def test_neighbour_correction_follows_the_rule(base, target, moves):
    m = online(base)
    b0 = base.estimate(JOB, G2).iteration_time_s
    m.observe(JOB, G2, 1.5 * b0, 20)
    got = m.estimate(JOB, target).iteration_time_s / base.estimate(JOB, target).iteration_time_s
    want = math.exp(_hand_prediction(m, G2, 20, math.log(1.5), target))
    assert got == pytest.approx(want, rel=1e-9)
    # the observation moves the same type's grids; another type's only through the
    # (fitted: none) job part and the communication part
    assert (got > 1.05) if moves else (1.0 <= got < 1.05)


def test_uncalibrated_device_moves_neighbours_by_nearly_the_whole_ratio(base):
    m = online(base)
    tiny = Job("j", "tiny-gpt__4L", 8, 100, 0.0)
    assert base.estimate(tiny, CPU1).feasible and base.estimate(tiny, CPU2).feasible
    b = base.estimate(tiny, CPU1).iteration_time_s
    m.observe(JOB, CPU1, 3.0 * b, 20)
    ratio = m.estimate(tiny, CPU2).iteration_time_s / base.estimate(tiny, CPU2).iteration_time_s
    assert ratio == pytest.approx(3.0, rel=0.1)


def test_communication_part_is_told_apart_with_two_observed_grids(base):
    """Truth = base x exp(2 x communication share): after observing two grids of
    different shares, a third grid's estimate is closer to it than the base, and than a
    rule without the communication part."""
    m = online(base)
    grids = [Grid(Shape(A100, 1, 1), 1), Grid(Shape(A100, 2, 4), 2), Grid(Shape(A100, 1, 8), 1),
             Grid(Shape(A100, 2, 2), 1)]
    shares = [m.comm_share(JOB, g) for g in grids]
    assert max(shares) - min(shares) > 0.2
    truth = {g: base.estimate(JOB, g).iteration_time_s * math.exp(2.0 * s) for g, s in zip(grids, shares)}
    for g in grids[:2]:
        m.observe(JOB, g, truth[g], 40)
    flat = online(base, prior=OnlinePrior(comm=0.0))
    for g in grids[:2]:
        flat.observe(JOB, g, truth[g], 40)
    for g in grids[2:]:
        err = abs(m.estimate(JOB, g).iteration_time_s / truth[g] - 1)
        assert err < abs(base.estimate(JOB, g).iteration_time_s / truth[g] - 1)
        assert err < abs(flat.estimate(JOB, g).iteration_time_s / truth[g] - 1)


def test_estimate_key_changes_with_every_observation_and_the_twin_shares_them():
    m = make_performance_model("online", base="analytic")
    m.observe(JOB, G2, 1.0, 5)
    k1 = m.estimate_key(JOB)
    m.observe(JOB, G2, 1.0, 5)
    assert k1 is not None and m.estimate_key(JOB) != k1
    twin = DpOnlyTwin()(m)
    assert twin.dp_only and twin.base.dp_only and twin.store is m.store
    assert twin.estimate_key(JOB) == m.estimate_key(JOB)


def test_feed_turns_running_means_into_new_iterations():
    seen = []

    class Recorder:
        def observe(self, job, grid, t, n):
            seen.append((job.job_id, grid, t, n))

        def estimate_key(self, job):
            return None

        def shared_key(self):
            return None

    feed = OnlineFeed(Recorder())
    a = Allocation(G2, ((0, 0), (0, 1)))
    b = Allocation(G2, ((0, 2), (0, 3)))
    feed.report(JOB, a, JobProgress("j", 5.0, True, measured_iteration_time_s=None, measured_iterations=0))
    feed.report(JOB, a, JobProgress("j", 5.0, True, measured_iteration_time_s=math.inf, measured_iterations=3))
    feed.report(JOB, a, JobProgress("j", 5.0, True, measured_iteration_time_s=math.nan, measured_iterations=3))
    feed.report(JOB, a, JobProgress("j", 10.0, True, measured_iteration_time_s=1.0, measured_iterations=10))
    feed.report(JOB, a, JobProgress("j", 30.0, True, measured_iteration_time_s=1.5, measured_iterations=30))
    feed.report(JOB, a, JobProgress("j", 30.0, True, measured_iteration_time_s=1.5, measured_iterations=30))
    feed.report(JOB, b, JobProgress("j", 40.0, True, measured_iteration_time_s=2.0, measured_iterations=4))
    assert seen == [("j", G2, 1.0, 10.0), ("j", G2, pytest.approx(1.75), 20.0), ("j", G2, 2.0, 4.0)]
    feed.keep_only([])                                      # stopped: its next run counts from zero
    feed.report(JOB, b, JobProgress("j", 50.0, True, measured_iteration_time_s=3.0, measured_iterations=6))
    assert seen[-1] == ("j", G2, 3.0, 6.0)
    OnlineFeed(make_performance_model("analytic")).report(JOB, a, JobProgress("j", 1.0, True, None, None, None,
                                                                               0.0, 1.0, 5))   # not learning: ignored


def _ctx(perf, jobs) -> RoundContext:
    cl = cluster(("a100", 1, 4))
    views = tuple(JobView(j, j.num_iterations, None, 0.0, 0.0, 0) for j in jobs)
    return RoundContext(0.0, 0, 300.0, cl, views, perf, ReconfigCostModel(), 0)


def _col(data, jid: str, shape: Shape) -> tuple[Grid, float]:
    """(grid, iterations per second) of ``jid``'s column for ``shape``."""
    j = data.job_ids.index(jid)
    k = next(k for k in range(data.n_cols) if data.col_job[k] == j and data.grids[k].shape == shape)
    return data.grids[k], float(data.col_rate_iters_per_s()[k])


def test_round_data_cache_serves_no_stale_estimate(base):
    m = online(base, prior=OWN_ONLY)
    j1, j2 = JOB, Job("k", JOB.model, JOB.global_batch, 1000, 0.0)
    cache = RoundDataCache()

    def fresh(data, job):           # every column's rate is the model's estimate now
        g, r = _col(data, job.job_id, G2.shape)
        assert r == pytest.approx(1.0 / m.estimate(job, g).iteration_time_s, rel=1e-12)
        return g, r
    d0 = build_round_data(_ctx(m, [j1, j2]), m, max_gpus=4, cache=cache)
    g0, r0 = fresh(d0, j1)
    assert fresh(d0, j2) == (g0, r0)
    m.observe(JOB, g0, 3.0 / r0, 25)
    d1 = build_round_data(_ctx(m, [j1, j2]), m, max_gpus=4, cache=cache)
    assert fresh(d1, j1)[1] < r0 / 2                                # not the cached estimate or block
    assert fresh(d1, j2) == (g0, r0)                                # the other job keeps the shared memo
    m.observe(JOB, g0, 1.0 / r0, 75)                                # the mean on g0 is now 1.5x
    d2 = build_round_data(_ctx(m, [j1, j2]), m, max_gpus=4, cache=cache)
    assert r0 / 1.6 < fresh(d2, j1)[1] < r0 / 1.4
    assert fresh(d2, j2) == (g0, r0)                                # the observed job's estimates stay its own


def test_round_data_cache_follows_other_jobs_established_runs(base):
    """Learning across jobs: another job's established run changes every job's estimates
    on that shape; the memo is emptied then, and not on runs still short of min_iterations."""
    m = online(base)
    j1, j2 = JOB, Job("k", JOB.model, JOB.global_batch, 1000, 0.0)
    cache = RoundDataCache()
    d0 = build_round_data(_ctx(m, [j1, j2]), m, max_gpus=4, cache=cache)
    g0, r0 = _col(d0, "k", G2.shape)
    key0 = m.shared_key()
    m.observe(j1, g0, 3.0 / r0, 10)                                 # short of min_iterations: own only
    assert m.shared_key() == key0
    assert _col(build_round_data(_ctx(m, [j1, j2]), m, max_gpus=4, cache=cache), "k", G2.shape)[1] == r0
    m.observe(j1, g0, 3.0 / r0, 15)                                 # established: 25 iterations at 3x
    assert m.shared_key() != key0
    d1 = build_round_data(_ctx(m, [j1, j2]), m, max_gpus=4, cache=cache)
    g1, r1 = _col(d1, "k", G2.shape)
    assert r1 == pytest.approx(1.0 / m.estimate(j2, g1).iteration_time_s, rel=1e-12)
    assert r0 / 3 < r1 < r0 / 1.5                                   # most of the way: same model, same shape


def _xjob_prediction(m: OnlineModel, job: Job, other: Job, grid: Grid, n: float, x: float) -> float:
    """One other job's established run on ``grid``'s shape: mu = cov / (var + noise) * x,
    the prior's parts written out here."""
    p = m.prior
    fj, fo = job.model.split("__")[0], other.model.split("__")[0]
    cov = p.shared_shape ** 2 + p.shared_family ** 2 * (fj == fo) + p.shared_model ** 2 * (job.model == other.model)
    s = m.comm_share(other, grid)
    t = p.type if grid.gpu_type in m.calibrated_types else p.new_type
    var = (p.shared_shape ** 2 + p.shared_family ** 2 + p.shared_model ** 2 + p.job ** 2 + t ** 2 + p.shape ** 2
           + p.grid ** 2 + p.comm ** 2 * s * s)
    return cov / (var + math.log1p(p.iteration_cv ** 2) / n) * x


@pytest.mark.parametrize("other", [Job("k", JOB.model, 64, 10, 0.0), Job("k", "gpt__2.6B", 128, 10, 0.0),
                                   Job("k", "moe__1.3B", 128, 10, 0.0)])
def test_another_jobs_run_corrects_the_shape_by_the_rule(base, other):
    m = online(base)
    b = base.estimate(other, G2).iteration_time_s
    m.observe(other, G2, 2.0 * b, 19)
    assert m.estimate(JOB, G2) == base.estimate(JOB, G2)            # not yet established
    m.observe(other, G2, 2.0 * b, 1)
    got = m.estimate(JOB, G2).iteration_time_s / base.estimate(JOB, G2).iteration_time_s
    want = math.exp(_xjob_prediction(m, JOB, other, G2, 20, math.log(2.0)))
    assert got == pytest.approx(want, rel=1e-9) and got > 1.05
    assert m.estimate(JOB, G4) == base.estimate(JOB, G4)            # another shape: nothing
    # the same pipeline depth or another one: the shape's shared part is the same
    g = Grid(G2.shape, 2)
    assert m.estimate(JOB, g).iteration_time_s / base.estimate(JOB, g).iteration_time_s == pytest.approx(got)
    assert online(base, prior=OWN_ONLY).estimate(JOB, G2) == base.estimate(JOB, G2)


def test_closer_relatives_move_the_estimate_more(base):
    ratios = []
    for model in (JOB.model, "gpt__2.6B", "moe__1.3B"):
        m = online(base)
        other = Job("k", model, 128, 10, 0.0)
        m.observe(other, G2, 2.0 * base.estimate(other, G2).iteration_time_s, 20)
        ratios.append(m.estimate(JOB, G2).iteration_time_s / base.estimate(JOB, G2).iteration_time_s)
    assert ratios[0] > ratios[1] > ratios[2] > 1.0


def test_own_runs_and_other_jobs_runs_combine(base):
    """The job's own run on G2 and others' runs on G4: on G4 the estimate starts from the
    others' shared correction and adds the part of the job's own residual it shares."""
    m = online(base)
    others = [Job(f"o{i}", JOB.model, 64 * (i + 1), 10, 0.0) for i in range(3)]
    for o in others:
        m.observe(o, G4, 0.5 * base.estimate(o, G4).iteration_time_s, 40)
    only_others = m.estimate(JOB, G4).iteration_time_s / base.estimate(JOB, G4).iteration_time_s
    assert only_others < 0.75
    m.observe(JOB, G2, 1.3 * base.estimate(JOB, G2).iteration_time_s, 20)
    both = m.estimate(JOB, G4).iteration_time_s / base.estimate(JOB, G4).iteration_time_s
    assert only_others < both < 1.0                                 # its own slowness carries over, in part
    assert m.estimate(JOB, G2).iteration_time_s == pytest.approx(1.3 * base.estimate(JOB, G2).iteration_time_s)
    mu, v, n = m.shared_effect(JOB, G4.shape)
    assert n == 3 and mu < 0 and 0 < v < m.prior.shared(*("gpt", JOB.model) * 2)


def test_a_jobs_own_run_is_not_counted_as_another_jobs(base):
    m = online(base)
    m.observe(JOB, G2, 2.0 * base.estimate(JOB, G2).iteration_time_s, 20)
    assert m.shared_effect(JOB, G2.shape)[2] == 0
    assert m.shared_effect(Job("k", JOB.model, 64, 10, 0.0), G2.shape)[2] == 1


def test_the_shared_stage_keeps_the_latest_runs_per_shape(base):
    m = online(base)
    for i in range(SHARED_WINDOW + 5):
        o = Job(f"o{i}", JOB.model, 128, 10, 0.0)
        m.observe(o, G2, (1.5 if i < 5 else 0.8) * base.estimate(o, G2).iteration_time_s, 20)
    mu, _, n = m.shared_effect(JOB, G2.shape)
    assert n == SHARED_WINDOW and mu == pytest.approx(math.log(0.8), abs=0.02)   # the 5 oldest (1.5x) dropped


def test_without_other_jobs_the_joint_prior_carries_over_as_the_own_only_fit(base):
    """With no other job's run, the shared parts act as the job's own shape part: the
    default (joint) prior gives the own-only fit's neighbour estimates."""
    a, b = online(base), online(base, prior=OWN_ONLY)
    for m in (a, b):
        m.observe(JOB, G2, 1.4 * base.estimate(JOB, G2).iteration_time_s, 20)
    for g in (G4, G4PP2, Grid(G2.shape, 2), Grid(Shape("a40", 1, 2), 1)):
        assert a.estimate(JOB, g).iteration_time_s == pytest.approx(b.estimate(JOB, g).iteration_time_s, rel=2e-3)


def test_simulated_estimate_converges_to_the_truth_through_measurements_only(base):
    """The oracle is 2.5x slower than the analytic estimate; the online model never sees
    the oracle, only SimExecutor's noisy measured times through the round loop."""
    g = Grid(Shape(A100, 1, 2), 1)
    truth = 2.5 * base.estimate(JOB, g).iteration_time_s
    oracle = LinearOracle(work_s=truth * 2)
    job = Job("j", JOB.model, JOB.global_batch, 10**6, 0.0)
    inst = Inst("online", cluster(("a100", 1, 4)), (job,), oracle, round_interval_s=truth * 8, horizon_rounds=6)
    m = online(base)
    seen = []

    def rule(ctx):
        seen.append(m.estimate(job, g).iteration_time_s)
        return {"j": g}
    simulate(inst, ScriptedPolicy(rule), perf=m, reconfig=ReconfigCostModel(replan_per_gpu_s=0.0))
    n = m.store.of("j")[g].iterations
    assert n >= 20
    assert seen[0] == base.estimate(job, g).iteration_time_s        # nothing measured before the first run
    est = m.estimate(job, g).iteration_time_s
    assert est == pytest.approx(truth, rel=0.05) and est != pytest.approx(truth, rel=1e-9)   # noisy, measured
    assert abs(base.estimate(job, g).iteration_time_s / truth - 1) > 0.5  # ignoring them would fail
    assert np.all(np.diff(seen[1:]) != 0)                           # every round's measurements reached it


@pytest.mark.slow
def test_live_round_loop_feeds_the_launchers_measurements(tmp_path):
    """The live path: MpiExecutor runs a real torch job; the round loop reads its
    progress each round and the online model receives the launcher's measured mean."""
    import time

    from engine.core.round_loop import RoundLoop
    from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig

    g = Grid(Shape("cpu", 1, 2), 1)
    job = Job("0", "tiny-gpt__2L", 8, 400, 0.0)
    m = make_performance_model("online")
    ex = MpiExecutor(MpiExecutorConfig(work_dir=str(tmp_path), checkpoint_every=0, checkpoint_interval_s=0.0,
                                       step_delay_s=0.02))
    loop = RoundLoop(cluster(("cpu", 1, 2)), ScriptedPolicy(lambda ctx: {"0": g}), ex, perf=m,
                     round_interval_s=1.0, jobs=[job])
    try:
        loop.submit("0", 0.0)
        loop.round(0.0, 0)
        seen = []
        for k in range(1, 40):
            time.sleep(1.0)
            loop.collect(float(k))
            loop.round(float(k), k)
            if m.store.of("0"):
                seen.append((m.store.of("0")[g].iterations, m.store.of("0")[g].mean_s,
                             loop.state.jobs["0"].measured_iteration_time_s))
            if len(seen) >= 2 and seen[-1][0] > seen[0][0]:
                break
    finally:
        ex.close()
    assert len(seen) >= 2 and seen[-1][0] > seen[0][0]         # every round's new steps arrive
    for n, mean, reported in seen:                              # the fed increments add up to the
        assert n >= 1 and mean == pytest.approx(reported, rel=1e-9)   # launcher's running mean
    assert m.estimate_key(job) is not None


class _GridByGrid:
    """The online model without its bulk path (what the round data does with a model
    that estimates grid by grid)."""

    def __init__(self, m: OnlineModel):
        self.m, self.name = m, m.name

    def estimate(self, job, grid):
        return self.m.estimate(job, grid)

    def observe(self, job, grid, iteration_time_s, iterations):
        self.m.observe(job, grid, iteration_time_s, iterations)

    def estimate_key(self, job):
        return self.m.estimate_key(job)

    def shared_key(self):
        return self.m.shared_key()


def _observed_cluster_model(base, seed: int):
    """An online model (nonzero ``grid`` part, so every term of the correction is used)
    with random runs of four jobs of three models on A100 and CPU grids, some
    established (shared stage), some short of ``min_iterations``, on a 2x4 A100 + 1x2 CPU
    cluster."""
    from estimators.grids import candidate_grids
    rng = np.random.default_rng(seed)
    cl = cluster(("a100", 2, 4), ("cpu", 1, 2))
    jobs = [Job("a", "gpt__1.3B", 128, 1000, 0.0), Job("b", "gpt__1.3B", 128, 1000, 0.0),
            Job("c", "gpt__350M", 64, 1000, 0.0), Job("d", "moe__690M", 64, 1000, 0.0)]
    m = online(base, prior=OnlinePrior(grid=0.05, job=0.03))
    for job in jobs[:3]:
        grids = candidate_grids(job, cl, max_gpus=8)
        for k in rng.choice(len(grids), size=3, replace=False):
            b = m.base.estimate(job, grids[k])
            if b.feasible:
                m.observe(job, grids[k], b.iteration_time_s * float(np.exp(rng.normal(0, 0.3))),
                          float(rng.choice([5, 25, 60])))
    return m, cl, jobs


@pytest.mark.parametrize("seed", range(6))
def test_bulk_throughputs_equal_the_grid_by_grid_estimates(base, seed):
    from estimators.base import throughputs
    from estimators.grids import candidate_grids
    m, cl, jobs = _observed_cluster_model(base, seed)
    assert m.store.established, "the draw establishes at least one run"
    for later in (False, True):       # then again after one more run is established (kept arrays updated)
        if later:
            grid = candidate_grids(jobs[3], cl, max_gpus=8)[seed]
            m.observe(jobs[3], grid, 1.7 * m.base.estimate(jobs[3], grid).iteration_time_s, 30)
        for job in jobs:              # observed, established in the shared window, and unobserved jobs
            grids = candidate_grids(job, cl, max_gpus=8)
            thr, plans = m.throughputs(job, grids)
            ref = [m.estimate(job, g) for g in grids]
            assert thr == pytest.approx([e.throughput if e.feasible else 0.0 for e in ref], rel=1e-12, abs=0)
            assert plans == [e.plan for e in ref]
            assert throughputs(_GridByGrid(m), job, grids) == (pytest.approx(thr, rel=1e-12, abs=0), plans)


@pytest.mark.parametrize("seed", range(4))
def test_round_data_from_bulk_estimates_equals_the_grid_by_grid_build(base, seed):
    """The columns (best depth per shape, the current grid kept, move prices) are the same
    whether the round data estimates in bulk or grid by grid."""
    m, cl, jobs = _observed_cluster_model(base, seed)
    running = Allocation(Grid(Shape(A100, 1, 2), 1), ((0, 0), (0, 1)))
    views = tuple(JobView(j, j.num_iterations, running if j.job_id == "a" else None, 0.0, 0.0, 0) for j in jobs)
    ctx = RoundContext(0.0, 0, 300.0, cl, views, m, ReconfigCostModel(), 0)
    bulk = build_round_data(ctx, m, max_gpus=8)
    one = build_round_data(ctx, _GridByGrid(m), max_gpus=8)
    assert isinstance(_GridByGrid(m), LearnsOnline) and not isinstance(_GridByGrid(m), EstimatesInBulk)
    assert bulk.grids == one.grids and bulk.plans == one.plans
    np.testing.assert_allclose(bulk.col_throughput, one.col_throughput, rtol=1e-12)
    np.testing.assert_array_equal(bulk.col_reconfig_s, one.col_reconfig_s)
    for k in range(bulk.n_cols):                # the kept grids are priced as moves from each job's state
        view = views[int(bulk.col_job[k])]
        assert bulk.col_reconfig_s[k] == ctx.reconfig.cost_to_grid_s(view.job, view.current, bulk.grids[k])
    assert bulk.col_reconfig_s[bulk.col_job == bulk.job_ids.index("a")].max() > 0
    np.testing.assert_array_equal(bulk.current_col, one.current_col)
    assert bulk.current_col[bulk.job_ids.index("a")] >= 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, -1.0, 1.0, 2.0, 2.0, 3.0, math.inf, math.nan])),
                min_size=1, max_size=12), st.integers(-1, 11))
def test_best_depth_per_shape_is_the_first_best_grid_and_keeps_the_current_one(cols, current):
    """``_block``'s vectorized pick against the rule written as a loop: per shape, the
    current grid if its estimate is usable, else the first grid (enumeration order) of
    the highest positive finite throughput; shapes without one are dropped."""
    from engine.decide.formulation.round_data import _block, _Candidates, _Layout
    grids = [Grid(Shape(A100, 1, 2 ** s), 1) for s, _ in cols]
    thr = [t for _, t in cols]
    current = current if current < len(cols) else -1
    keys = sorted({(A100, 1, 2 ** s) for s, _ in cols})
    group = np.array([keys.index((A100, 1, 2 ** s)) for s, _ in cols])
    z = np.zeros(len(cols))
    cand = _Candidates(grids, group, keys, z.astype(np.int64), z.astype(np.int64), z.astype(np.int64),
                       z.astype(np.int64), {})
    lay = _Layout(cand, np.arange(len(cols), dtype=float), current, 0.0)
    best: dict = {}
    for i, (k, t) in enumerate(zip(group, thr)):
        if not (t > 0 and math.isfinite(t)):
            continue
        rank = math.inf if i == current else t
        if k not in best or rank > best[k][0]:
            best[k] = (rank, i)
    want = [best[k][1] for k in sorted(best)]
    b = _block(None, JobView(JOB, 1000, None, 0.0, 0.0, 0), lay, thr, list(range(len(cols))))   # prices given
    if not want:
        assert b is None
        return
    assert list(b.plans) == want                      # plans stand in for the grid indices
    assert list(b.col_reconfig_s) == [float(i) for i in want]
    assert b.current == (want.index(current) if current in want else -1)


def test_derived_caches_stay_bounded_and_estimates_survive_their_clearing(base):
    from estimators.grids import candidate_grids
    m, cl, jobs = _observed_cluster_model(base, 0)
    m.MAX_CACHED = 3                     # an instance attribute: the class default is untouched
    before = {}
    for job in jobs:
        grids = tuple(candidate_grids(job, cl, max_gpus=8))        # a tuple: the model keeps it by identity too
        before[job.job_id] = m.throughputs(job, grids)
        sizes = m.cache_sizes()
        assert {"fits", "grid_sets", "grid_tuples", "shares"} <= set(sizes) and max(sizes.values()) <= 3
    for job in jobs:                     # recomputed after being dropped: the same estimates
        grids = candidate_grids(job, cl, max_gpus=8)
        assert m.throughputs(job, grids) == before[job.job_id]
    assert type(m).MAX_CACHED == 20_000


def _shared_effect_from_scratch(m: OnlineModel, job: Job, shape, runs) -> tuple[float, float, int]:
    """The shared stage's kriging written out from the module docstring over ``runs``
    ((job, grid, log error, iterations) of other jobs on ``shape``), nothing cached."""
    p = m.prior
    fam = m.family

    def own(a, b):          # one job's own parts between two of its runs
        (ja, ga), (jb, gb) = a, b
        if ja.job_id != jb.job_id:
            return 0.0
        t = p.type if ga.gpu_type in m.calibrated_types else p.new_type
        return (p.job ** 2 + p.comm ** 2 * m.comm_share(ja, ga) * m.comm_share(jb, gb) + t ** 2
                + p.shape ** 2 + p.grid ** 2 * (ga == gb))

    n = len(runs)
    C = np.array([[p.shared(fam(a[0].model), a[0].model, fam(b[0].model), b[0].model) + own(a[:2], b[:2])
                   + (math.log1p(p.iteration_cv ** 2) / a[3] if i == k else 0.0)
                   for k, b in enumerate(runs)] for i, a in enumerate(runs)])
    t = np.array([p.shared(fam(job.model), job.model, fam(r[0].model), r[0].model) for r in runs])
    x = np.array([r[2] for r in runs])
    prior_v = p.shared(fam(job.model), job.model, fam(job.model), job.model)
    return float(t @ np.linalg.solve(C, x)), prior_v - float(t @ np.linalg.solve(C, t)), n


def test_shared_effect_leaving_one_job_out_is_the_kriging_over_the_others(base):
    """The shared stage keeps one covariance matrix per shape and, for a job that has runs
    there itself, solves on the sub-matrix of the other jobs' runs: the same as kriging
    over those runs alone, before and after another run is taken in."""
    shape = G4.shape
    jobs = [JOB, Job("k", JOB.model, 64, 10, 0.0), Job("l", "gpt__2.6B", 128, 10, 0.0),
            Job("n", "moe__1.3B", 128, 10, 0.0)]
    m = online(base, prior=OnlinePrior(grid=0.05, job=0.03))
    runs = []
    for i, (job, g, ratio) in enumerate([(jobs[0], G4, 1.3), (jobs[1], G4, 0.7), (jobs[1], G4PP2, 0.8),
                                         (jobs[2], G4, 1.1), (jobs[0], G4PP2, 1.25), (jobs[3], G4, 0.9)]):
        b = base.estimate(job, g).iteration_time_s
        m.observe(job, g, ratio * b, 20 + 5 * i)
        runs.append((job, g, math.log(ratio), 20 + 5 * i))
        for who in jobs + [Job("new", "gpt__350M", 64, 10, 0.0)]:
            others = [r for r in runs if r[0].job_id != who.job_id]
            got = m.shared_effect(who, shape)
            if not others:
                assert got[2] == 0
                continue
            want = _shared_effect_from_scratch(m, who, shape, others)
            assert got[2] == want[2] and got[0] == pytest.approx(want[0], rel=1e-9, abs=1e-12)
            assert got[1] == pytest.approx(want[1], rel=1e-9, abs=1e-12)


def test_a_fit_kept_across_runs_elsewhere_gives_the_estimates_of_a_fresh_model(base):
    """A job's own kriging is kept when the runs established since touch none of its
    shapes: its estimates then equal those of a model fed the same observations afresh."""
    other_shape = Grid(Shape(A100, 2, 4), 1)
    late = [Job(f"o{i}", "gpt__2.6B", 128, 10, 0.0) for i in range(3)]
    kept = online(base)
    kept.observe(JOB, G2, 1.3 * base.estimate(JOB, G2).iteration_time_s, 20)
    before = [kept.estimate(JOB, g).iteration_time_s for g in (G4, G4PP2, other_shape)]
    for o in late:              # runs on a shape JOB has no run on: its fit stays
        kept.observe(o, other_shape, 0.6 * base.estimate(o, other_shape).iteration_time_s, 20)
    fresh = online(base)
    fresh.observe(JOB, G2, 1.3 * base.estimate(JOB, G2).iteration_time_s, 20)
    for o in late:
        fresh.observe(o, other_shape, 0.6 * base.estimate(o, other_shape).iteration_time_s, 20)
    after = [kept.estimate(JOB, g).iteration_time_s for g in (G4, G4PP2, other_shape)]
    assert after == [fresh.estimate(JOB, g).iteration_time_s for g in (G4, G4PP2, other_shape)]
    assert after[:2] == before[:2] and after[2] < before[2]      # only the other shape moved
    # a run on its own shape changes the fit
    kept.observe(late[0], G2, 0.5 * base.estimate(late[0], G2).iteration_time_s, 20)
    fresh.observe(late[0], G2, 0.5 * base.estimate(late[0], G2).iteration_time_s, 20)
    assert kept.estimate(JOB, G4).iteration_time_s == fresh.estimate(JOB, G4).iteration_time_s != after[0]


_HISTORY_JOBS = (Job("a", "gpt__1.3B", 128, 1000, 0.0), Job("b", "gpt__1.3B", 128, 1000, 0.0),
                 Job("c", "gpt__350M", 64, 1000, 0.0), Job("d", "moe__690M", 64, 1000, 0.0))
_HISTORY_GRIDS = (G2, G4, G4PP2, Grid(Shape(A100, 2, 4), 1), Grid(Shape(A100, 2, 4), 2), CPU2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.floats(0.5, 2.0), st.sampled_from([5.0, 15.0, 25.0]),
                          st.booleans()), min_size=1, max_size=14))
def test_estimates_kept_through_a_history_equal_a_fresh_models(base, history):
    """Whatever the order of observations, established runs and queries, a model that kept
    its fits, shared effects and grid arrays from query to query estimates every job as a
    model fed the same observations afresh, to the last bit (the kept parts: the last
    fit's effects on shapes without new runs, its prior covariance, grids known by identity),
    and so does one told every job at once before the queries (``prepare``: the jobs'
    systems solved as one stack)."""
    prior = OnlinePrior(grid=0.05, job=0.03)
    kept, bulk = online(base, prior=prior), online(base, prior=prior)
    fed = []
    for j, k, ratio, iterations, query in history:
        job, grid = _HISTORY_JOBS[j], _HISTORY_GRIDS[k]
        b = base.estimate(job, grid)
        if not b.feasible:
            continue
        for m in (kept, bulk):
            m.observe(job, grid, ratio * b.iteration_time_s, iterations)
        fed.append((job, grid, ratio * b.iteration_time_s, iterations))
        if not query:                   # the kept model falls behind by more than one change
            continue
        fresh = online(base, prior=prior)
        for obs in fed:
            fresh.observe(*obs)
        bulk.prepare(_HISTORY_JOBS)     # every job's fit, solved together with the others of its size
        for job in _HISTORY_JOBS:
            want = fresh.throughputs(job, list(_HISTORY_GRIDS))
            assert kept.throughputs(job, _HISTORY_GRIDS) == want
            assert bulk.throughputs(job, _HISTORY_GRIDS) == want
