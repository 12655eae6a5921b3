"""The round's placement (engine/core/round_placement.py): a policy's fallbacks taken
where its grids do not fit, property-based and through the round loop; the shadow is
compared on the grids it would run."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings

from engine.core.context import Decisions, DecisionStats
from engine.core.policy import Policy
from engine.core.round_placement import MAX_FALLBACK_ROUNDS, take_fallbacks
from engine.sim.simulator import simulate
from instances.allocation import Allocation
from instances.grid import Grid, Shape
from tests.test_engine_helpers import Inst, LinearOracle, ScriptedPolicy, cluster, grid, job
from tests.test_placement import scenarios


class Halving:
    """A job's fallback: half the GPUs per node, else half the nodes (None at one GPU);
    records each call."""

    def __init__(self):
        self.calls: list[tuple[str, Grid, Grid | None]] = []     # (job, than, the fallback given)

    def smaller(self, job_id, than):
        s = than.shape
        alt = (Grid(Shape(s.gpu_type, s.num_nodes, s.gpus_per_node // 2)) if s.gpus_per_node > 1 else
               Grid(Shape(s.gpu_type, s.num_nodes // 2, 1)) if s.num_nodes > 1 else None)
        self.calls.append((job_id, than, alt))
        return None if alt is None else (alt, None)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_fallbacks_leave_only_grids_that_place_where_they_were_pinned(sc):
    spec, placer, current, requests = sc
    fb = Halving()
    out = take_fallbacks(placer, Decisions(requests, fallbacks=fb), current, frozenset())
    assert out.fallbacks is None
    dropped = out.stats.placement_dropped
    # every job either runs (its grid, or a fallback of it) or is dropped, never both
    assert set(out.grids) | set(dropped) == set(requests) and not set(out.grids) & set(dropped)
    for jid, g in out.grids.items():
        assert g == requests[jid] or (g.gpu_type == requests[jid].gpu_type and g.num_gpus < requests[jid].num_gpus)
    # a fallback is asked only for the grid the job has at that point; the repairs are
    # the fallbacks given; a job is asked at most once per placement pass
    given_now = dict(requests)
    for jid, than, alt in fb.calls:
        assert than == given_now[jid]
        if alt is not None:
            given_now[jid] = alt
    assert {j: given_now[j] for j in out.grids} == dict(out.grids)
    assert out.stats.placement_repairs == sum(1 for *_, alt in fb.calls if alt is not None)
    assert dict(out.stats.placement_fallbacks) == {j: str(requests[j]) for j, g in out.grids.items()
                                                   if g != requests[j]}
    assert len(fb.calls) <= MAX_FALLBACK_ROUNDS * len(requests)
    # what is left places as pinned: nothing fails, no pin is rejected, every pin is kept
    res = placer.place(out.grids, current, out.placements)
    assert not res.failed and not res.pins_rejected
    assert set(out.placements) == set(out.grids)
    assert {j: a.gpus for j, a in res.allocations.items()} == {j: tuple(g) for j, g in out.placements.items()}


def test_decisions_without_fallbacks_come_back_unchanged():
    from engine.core.placement import Placer
    d = Decisions({"A": grid("a100", 1, 4)})
    assert take_fallbacks(Placer(cluster(("a100", 1, 4))), d, {}, frozenset()) is d


@dataclass
class FallbackPolicy(Policy):
    """Decides ``rule(ctx)`` and hands ``smaller``: {job: grid} as each job's one fallback."""
    rule: object
    smaller_grids: dict
    name: str = "with-fallbacks"
    seen: list = field(default_factory=list)

    def fallbacks(self):
        grids = self.smaller_grids

        class One:
            def smaller(self, job_id, than):
                g = grids.get(job_id)
                return None if g is None or g.num_gpus >= than.num_gpus else (g, None)
        return One()

    def decide(self, ctx):
        self.seen.append(ctx)
        return Decisions(dict(self.rule(ctx)), stats=DecisionStats(backend="test"), fallbacks=self.fallbacks())


def _two_jobs():
    # one node of 4 A100s; A from round 0, B from round 1 (300 s)
    return Inst("fallbacks", cluster(("a100", 1, 4)), (job("A", 0.0, 1000), job("B", 100.0, 1000)),
                LinearOracle(10.0))


def test_a_grid_that_does_not_fit_takes_its_fallback_or_waits():
    from engine.core.placement import Placer
    placer = Placer(cluster(("a100", 1, 4)))
    one = FallbackPolicy(None, {"B": grid("a100", 1, 2)})
    # A (1x4) fills the node; B's 1x4 does not fit, nor its fallback 1x2 (taken: one
    # repair), and it has no smaller one: B waits
    out = take_fallbacks(placer, Decisions({"A": grid("a100", 1, 4), "B": grid("a100", 1, 4)},
                                           fallbacks=one.fallbacks()), {}, frozenset())
    assert dict(out.grids) == {"A": grid("a100", 1, 4)}
    assert (out.stats.placement_repairs, out.stats.placement_dropped) == (1, ("B",))
    # beside A, which runs on 1x2 and keeps its GPUs, B's fallback fits: B runs on it, one
    # repair, both pinned
    a_now = {"A": Allocation(grid("a100", 1, 2), ((0, 2), (0, 3)))}
    out = take_fallbacks(placer, Decisions({"A": grid("a100", 1, 2), "B": grid("a100", 1, 4)},
                                           stats=DecisionStats(backend="kept"), fallbacks=one.fallbacks()),
                         a_now, frozenset())
    assert dict(out.grids) == {"A": grid("a100", 1, 2), "B": grid("a100", 1, 2)}
    assert (out.stats.placement_repairs, out.stats.placement_dropped, out.stats.backend) == (1, (), "kept")
    assert dict(out.placements) == {"A": ((0, 2), (0, 3)), "B": ((0, 0), (0, 1))}
    assert dict(out.stats.placement_fallbacks) == {"B": str(grid("a100", 1, 4))}     # what the policy chose first


def _half_a(ctx):
    return {v.job_id: grid("a100", 1, 2 if v.job_id == "A" else 4) for v in ctx.jobs}


def _halves(ctx):
    return {v.job_id: grid("a100", 1, 2) for v in ctx.jobs}


def test_the_loop_runs_a_job_on_its_fallback():
    # round 1: A keeps its 1x2, B's 1x4 does not fit beside it, its fallback 1x2 does
    res = simulate(_two_jobs(), FallbackPolicy(_half_a, {"B": grid("a100", 1, 2)}), rounds=2,
                   shadow=ScriptedPolicy(_halves))
    r0 = res.rounds[1]
    assert (r0.running, r0.queued, r0.packing_failures) == (2, 0, 0)
    # the shadow, which chose 1x2 for B outright, agrees with the decision as settled
    assert r0.shadow is not None and r0.shadow.all_agree
    # without the fallback B waits, and that is not a packing failure of the round: the
    # decision as settled left it out
    r0 = simulate(_two_jobs(), FallbackPolicy(_half_a, {}), rounds=2).rounds[1]
    assert (r0.running, r0.queued, r0.packing_failures) == (1, 1, 0)


def test_a_shadow_with_fallbacks_is_compared_on_the_grids_it_would_run():
    shadow = FallbackPolicy(_half_a, {"B": grid("a100", 1, 2)}, name="shadow-with-fallbacks")
    r1 = simulate(_two_jobs(), ScriptedPolicy(_halves), rounds=2, shadow=shadow).rounds[1]
    assert r1.shadow is not None and r1.shadow.all_agree
    r1 = simulate(_two_jobs(), ScriptedPolicy(_halves), rounds=2,
                  shadow=FallbackPolicy(_half_a, {}, name="shadow-without")).rounds[1]
    assert r1.shadow is not None and r1.shadow.disagreements == 1     # B would wait
    assert [(d.job_id, d.shadow) for d in r1.shadow.differ] == [("B", None)]


class Refining:
    """``Decisions.refine``: each call drops the failed jobs' grids for their ``alt`` (or
    leaves them out), recording the calls; ``stubborn`` keeps failing grids as they are."""

    def __init__(self, alt: dict, stubborn: bool = False):
        self.alt, self.stubborn, self.calls = alt, stubborn, []
        self.grids: dict = {}

    def decisions(self, grids: dict) -> Decisions:
        self.grids = dict(grids)
        return Decisions(dict(grids), stats=DecisionStats(backend="refined"), refine=self,
                         fallbacks=Halving())

    def without(self, failed):
        self.calls.append(dict(failed))
        grids = dict(self.grids)
        if not self.stubborn:
            for jid in failed:
                grids.pop(jid)
                if jid in self.alt:
                    grids[jid] = self.alt.pop(jid)
        return self.decisions(grids)


def test_a_policy_that_can_refine_decides_again_without_what_did_not_fit():
    from engine.core.placement import Placer
    from engine.core.round_placement import MAX_REFINES
    placer = Placer(cluster(("a100", 2, 4)))
    # A holds 2 GPUs on each node; B's 1x4 does not fit beside it; asked again without it,
    # the policy gives B 2x2, which fits: no fallback, B is not told to wait
    a_now = {"A": Allocation(grid("a100", 2, 2), ((0, 0), (0, 1), (1, 0), (1, 1)))}
    pol = Refining({"B": grid("a100", 2, 1)})
    out = take_fallbacks(placer, pol.decisions({"A": grid("a100", 2, 2), "B": grid("a100", 1, 4)}), a_now,
                         frozenset())
    assert pol.calls == [{"B": grid("a100", 1, 4)}]
    assert dict(out.grids) == {"A": grid("a100", 2, 2), "B": grid("a100", 2, 1)}
    st = out.stats
    assert (st.placement_refines, st.columns_cut, st.placement_repairs, st.placement_dropped) == (1, 1, 0, ())
    assert st.backend == "refined" and out.refine is None and out.fallbacks is None
    # a policy whose new decisions keep failing is asked at most MAX_REFINES times, then its
    # fallbacks are taken (1x4 -> 1x2 fits beside A)
    stubborn = Refining({}, stubborn=True)
    out = take_fallbacks(placer, stubborn.decisions({"A": grid("a100", 2, 2), "B": grid("a100", 1, 4)}), a_now,
                         frozenset())
    assert len(stubborn.calls) == MAX_REFINES
    assert dict(out.grids) == {"A": grid("a100", 2, 2), "B": grid("a100", 1, 2)}
    assert (out.stats.placement_refines, out.stats.columns_cut, out.stats.placement_repairs) == (MAX_REFINES,
                                                                                                 MAX_REFINES, 1)


@dataclass
class RefiningPolicy(Policy):
    """Decides ``rule(ctx)``; asked again without what did not fit, gives each failed job
    its grid in ``alt`` (a fresh ``Refining`` per round)."""
    rule: object
    alt: dict
    name: str = "refining"

    def decide(self, ctx):
        return Refining(dict(self.alt)).decisions(dict(self.rule(ctx)))


def test_the_loop_asks_a_policy_to_refine_and_records_it():
    # round 1: A keeps its 1x2; B's 1x4 does not fit beside it; decided again, the policy
    # gives B 1x2, which fits: one refinement, no fallback, nobody told to wait (the
    # decision check passes refine through, checking its new decisions)
    res = simulate(_two_jobs(), RefiningPolicy(_half_a, {"B": grid("a100", 1, 2)}), rounds=2)
    r1 = res.rounds[1]
    assert (r1.running, r1.queued, r1.packing_failures) == (2, 0, 0)
    assert (r1.refines, r1.fallbacks, r1.fallback_waits) == (1, 0, 0)
    s = res.summary
    assert (s["placement_refines"], s["rounds_refined"], s["fallbacks"], s["fallback_waits"]) == (1, 1, 0, 0)
    # a refinement that decides for a job the round does not have is refused, naming the policy
    from engine.core.decision_check import PolicyError

    class Unknown(Refining):
        def without(self, failed):
            return self.decisions({**self.grids, "Z": grid("a100", 1, 1)})

    @dataclass
    class Bad(Policy):
        name: str = "refining-badly"

        def decide(self, ctx):
            return Unknown({}).decisions(dict(_half_a(ctx)))

    with pytest.raises(PolicyError, match="policy 'refining-badly', round 1: decided for job 'Z'"):
        simulate(_two_jobs(), Bad(), rounds=2)
