"""Why a job runs smaller than it asked, or was preempted: each decided round stores, per
job that asked for GPUs and got fewer (or none), the first of a fallback, a memory fit or
the policy's estimate (engine/service/why.py); a running job the decision leaves without
a grid is stopped with a history naming the round and who takes its GPUs (a drain on a
full cluster can cost a job on a node in service its place). Real performance model,
real placement, a real service over a real store (no job launched)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.core.context import Decisions, DecisionStats, JobView, RoundContext
from engine.core.policy import make_policy
from engine.core.reconfig import ReconfigCostModel
from engine.service.daemon import Service, ServiceConfig
from engine.service.jobspec import JobSpec
from engine.service.why import explain
from estimators.perf import make_default_model
from instances.allocation import Allocation
from instances.cluster import ClusterSpec, NodeGroup
from tests.test_engine_helpers import grid

TWO = ClusterSpec((NodeGroup("cpu", 2, 2),), "two-by-two")


def _view(jid: str, gpus: int | None, current: Allocation | None = None, infeasible=frozenset()) -> JobView:
    job = JobSpec(f"j{jid}", "tiny-gpt__2L", 8, 100, gpus=gpus).to_job(jid, 0.0)
    return JobView(job, 100.0, current, known_infeasible_shapes=frozenset(infeasible))


def _ctx(*views: JobView, unavailable=frozenset()) -> RoundContext:
    return RoundContext(10.0, 7, 60.0, TWO, tuple(views), make_default_model(), ReconfigCostModel(),
                        unavailable_nodes=frozenset(unavailable))


def test_a_job_given_fewer_gpus_than_asked_is_explained_by_the_first_reason_that_holds():
    perf = make_default_model()
    one, two = grid("cpu", 1, 1), grid("cpu", 1, 2)
    ran_out = {two.shape, grid("cpu", 2, 1).shape}            # every 2-GPU shape, measured out of memory
    ctx = _ctx(_view("1", 2), _view("2", 2), _view("3", 2), _view("4", 3), _view("5", 2, infeasible=ran_out),
               _view("6", 1), _view("7", None), _view("8", 2))
    stats = DecisionStats(placement_fallbacks={"2": str(two)}, placement_dropped=("3",))
    why = explain(ctx, Decisions({"1": one, "2": one, "6": one, "7": one}, stats=stats), "arena")
    assert set(why) == {"1", "2", "3", "4", "5", "8"}                # 6 and 7 got what they asked (or asked none)
    rate = 1 / perf.estimate(ctx.jobs[0].job, one).iteration_time_s
    assert why["1"].startswith(f"the policy's estimate (analytic): {rate:.3g} it/s on {one} against ")
    assert "(2 GPUs, the best shape)" in why["1"]
    assert why["2"] == (f"a fallback: arena chose {two}, which did not fit the GPUs free this round; the placement "
                        f"took its smaller alternative {one}")
    assert why["3"].startswith("a fallback: arena chose a grid for it that did not fit")
    assert why["4"] == "memory: cluster 'two-by-two' has no grid of 3 GPUs for it"
    assert why["5"].startswith("memory: every 2-GPU grid ran out of memory or is estimated not to fit")
    assert why["8"].endswith("(2 GPUs, the best shape); arena left it waiting this round (other jobs' grids, or "
                             "none of its grids fitting the GPUs free)")


def test_a_rounds_reasons_are_bounded():
    from engine.service.why import MAX_EXPLAINED
    views = [_view(str(i), 2) for i in range(1, MAX_EXPLAINED + 20)]
    assert len(explain(_ctx(*views), Decisions({}), "arena")) == MAX_EXPLAINED


@pytest.fixture
def service(tmp_path):
    svc = Service(ClusterSpec((NodeGroup("cpu", 3, 1),), "local-3x1"), make_policy("fcfs"), None,
                  ReconfigCostModel(), ServiceConfig(db_path=str(tmp_path / "state.db"), work_dir=str(tmp_path / "w")),
                  log=lambda m: None)
    try:
        yield svc
    finally:
        svc.shutdown()


def test_a_job_preempted_to_make_room_for_one_leaving_a_drained_node_is_told_which_and_why(service):
    """The issue's drain on a full cluster: jobs on nodes 0, 1, 2; node 1 drained; the
    decision moves job 2 onto node 2 and leaves job 3 (on node 2, in service) without a
    grid. Job 3's stop names the round, the policy and job 2 leaving the drained node;
    job 2's own reason is the drain's (apply_drains), not overwritten."""
    on = {n: Allocation(grid("cpu", 1, 1), ((n, 0),)) for n in range(3)}
    ctx = replace(_ctx(_view("1", 1, on[0]), _view("2", 1, on[1]), _view("3", 1, on[2]), unavailable={1}),
                  cluster=service.cluster)
    service.executor.stop_reasons["2"] = "node 1 drained"
    decisions = Decisions({"1": on[0].grid, "2": on[2].grid}, placements={"1": on[0].gpus, "2": on[2].gpus})
    service._preemption_reasons(ctx, decisions)
    assert service.executor.stop_reasons == {
        "2": "node 1 drained",
        "3": "preempted by round 7's decision (fcfs gave it no grid this round; its GPUs go to job 2 (leaving a node "
             "out of service))"}
