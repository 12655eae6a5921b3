"""The baselines as their authors' simulator runs them on the Sia artifact's goodput jobs
(sia, gavel, pollux) and arena over goodput columns, on the project's own fixture in the
artifact's layout (tests/data/sia_artifact)."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli.common import goodput_perf, reconfig_for
from engine.core.policy import Policy, make_policy
from engine.decide.policies.gavel_goodput import HELD
from engine.sim.simulator import simulate
from instances.errors import InputError
from instances.goodput import ADAPTIVE, BatchPlan
from instances.sia_instances import load_sia_instance

FIXTURE = Path(__file__).parent / "data" / "sia_artifact"


class Recorder(Policy):
    """A policy that records every round's context and decision of the policy it wraps."""

    def __init__(self, inner):
        self.inner, self.name, self.rounds = inner, inner.name, []
        self.event_driven, self.max_queued = inner.event_driven, inner.max_queued

    def decide(self, ctx):
        d = self.inner.decide(ctx)
        self.rounds.append((ctx, d))
        return d


def _run(name: str, workload: str = "mini/workload-1", **opts):
    inst = load_sia_instance("sia:" + workload, FIXTURE)
    pol = Recorder(make_policy(name, **opts))
    res = simulate(inst, pol, perf=goodput_perf(None, None, None, inst.oracle), reconfig=reconfig_for(inst, {}),
                   run_out=True, iteration_noise_cv=0.0)
    return inst, pol, res


@pytest.mark.parametrize("policy", ["sia", "gavel", "pollux", "arena"])
def test_every_job_finishes_no_earlier_than_alone(policy):
    from instances.bounds import jct_lower_bounds
    inst, _, res = _run(policy)
    assert res.summary["jobs_finished_runout"] == len(inst.jobs)
    bounds = {b.job_id: b.bound_s for b in jct_lower_bounds(inst.jobs, inst.cluster, inst.oracle,
                                                             round_interval_s=inst.round_interval_s, max_gpus=64)}
    for j in res.jobs:
        assert j.jct_s >= bounds[j.job_id] - 1e-6


def test_sia_starts_a_job_on_one_gpu_and_at_most_doubles_what_it_ran_on():
    _, pol, _ = _run("sia")
    seen: dict[str, int] = {}
    for ctx, d in pol.rounds:
        for v in ctx.jobs:             # what the job has computed on by now (past its restart)
            if v.current is not None and ctx.now_s > v.last_change.changed_at_s + v.job.restart_s:
                seen[v.job_id] = max(seen.get(v.job_id, 0), v.current.grid.num_gpus)
        for v in ctx.jobs:
            g = d.grids.get(v.job_id)
            if g is None:
                continue
            if v.job_id not in seen:
                assert g.num_gpus == 1, "Sia's bootstrapping: one GPU before any profile"
            else:
                assert g.num_gpus <= max(2 * seen[v.job_id], 1)
            assert d.plans[v.job_id] == ADAPTIVE
    assert max(seen.values()) > 1          # the jobs did grow


def test_sia_keeps_a_job_in_its_restart():
    _, pol, _ = _run("sia")
    checked = 0
    for ctx, d in pol.rounds:
        for v in ctx.jobs:
            if v.current is not None and ctx.now_s < v.last_change.changed_at_s + v.job.restart_s:
                assert d.grids[v.job_id].num_gpus == v.current.grid.num_gpus
                checked += 1
    assert checked > 0


def test_gavel_runs_the_workloads_counts_and_batches_in_360_s_rounds():
    inst, pol, _ = _run("gavel")
    want = {j.job_id: (j.requested_gpus, j.requested_batch) for j in inst.jobs}
    decided = [ctx.now_s for ctx, d in pol.rounds if d.stats.message != HELD]
    assert all(b - a >= 360 - 1e-6 for a, b in zip(decided, decided[1:]))
    for ctx, d in pol.rounds:
        for jid, g in d.grids.items():
            assert g.num_gpus == want[jid][0]
            assert d.plans[jid] == BatchPlan(fixed=want[jid][1])


def test_pollux_is_heterogeneity_unaware_and_refuses_fixed_batch_jobs():
    _, pol, res = _run("pollux")
    assert res.summary["jobs_finished_runout"] == 4
    from engine.cli.common import build_perf
    from instances.builtin import get_instance
    inst = get_instance("demo")
    with pytest.raises(InputError, match="decides only the Sia artifact's adaptive-batch goodput jobs"):
        simulate(inst, make_policy("pollux"), perf=build_perf(None, "pollux"), rounds=2)
    with pytest.raises(InputError, match="unknown option"):
        make_policy("pollux", lambda_n=1)


def test_options_of_the_goodput_forms():
    _run("sia", p=-1.0, lambda_n=2.0)                                # accepted and read
    with pytest.raises(InputError, match=r"p must be a finite number in \[-10, 10\], not 0"):
        make_policy("sia", p=0)
    with pytest.raises(InputError, match=r"round_s must be a finite number in \[1, 86400\]"):
        make_policy("gavel", round_s=0)
    _, pol, _ = _run("gavel", round_s=120)
    decided = [ctx.now_s for ctx, d in pol.rounds if d.stats.message != HELD]
    assert min(b - a for a, b in zip(decided, decided[1:])) == pytest.approx(120.0)


def test_arena_chooses_shapes_with_adaptive_batches():
    _, pol, res = _run("arena")
    assert any(d.grids for _, d in pol.rounds)
    for _, d in pol.rounds:
        for jid in d.grids:
            assert d.plans[jid] == ADAPTIVE


def test_sia_ap_is_sia_on_goodput_jobs():
    _, _, a = _run("sia")
    _, _, b = _run("sia-ap")
    assert [j.jct_s for j in a.jobs] == [j.jct_s for j in b.jobs]


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--instance", "sia:mini/workload-1", "--policy", "sia"],
     "field '--sia-artifact': instance 'sia:mini/workload-1' is read from the Sia artifact: give --sia-artifact DIR"),
    (["simulate", "--instance", "demo", "--sia-artifact", str(FIXTURE), "--policy", "sia"],
     "field '--sia-artifact': --sia-artifact is read only for --instance sia:TRACE/WORKLOAD"),
    (["simulate", "--instance", "sia:mini/workload-1", "--sia-artifact", str(FIXTURE), "--perf", "analytic"],
     "field '--perf': the Sia artifact's goodput jobs are estimated from its own profiles (sia-profiles); "
     "--perf analytic does not apply to them"),
    (["simulate", "--instance", "sia:mini/workload-1", "--sia-artifact", str(FIXTURE), "--reconfig-opt",
      "preset=realistic"], "field '--reconfig-opt': preset realistic prices a move by the model's size"),
    (["simulate", "--instance", "sia:mini/workload-1", "--sia-artifact", str(FIXTURE / "nowhere")],
     "nowhere, field '--sia-artifact': does not exist"),
])
def test_cli_errors(argv, message, capsys, tmp_path):
    from engine.cli.main import main
    assert main(argv + ["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("arena: error: ") and message in err


def test_pollux_throughput_fit_recovers_its_own_model():
    import numpy as np

    from estimators.goodput import fit_throughput, fitted_iteration_time
    true = np.array([0.02, 0.004, 0.05, 0.002, 0.01, 0.001, 1.5])
    pts = []
    for nodes, reps in ((1, 1), (1, 2), (1, 4), (2, 8), (3, 12)):
        for b in (8, 16, 32):
            step = float(fitted_iteration_time(true, nodes, reps, np.array([b], float), np.array([0.0]))[0])
            comp = true[0] + true[1] * b
            pts.append((nodes, reps, b, step, step - comp))
    p = fit_throughput(pts)
    for nodes, reps, b, step, _ in pts:
        pred = float(fitted_iteration_time(p, nodes, reps, np.array([b], float), np.array([0.0]))[0])
        assert pred == pytest.approx(step, rel=0.05)
    # one configuration seen: alpha_c is held at half its compute time, the network terms at their bounds
    one = fit_throughput([(1, 1, 16, 0.1, 0.0)])
    assert one[0] == pytest.approx(0.05) and one[2] == pytest.approx(one[4] * 1.1)


def test_sia_with_fitted_estimates_runs_the_fixture_out():
    inst, _, res = _run("sia", estimates="fitted")
    assert res.summary["jobs_finished_runout"] == len(inst.jobs)
    with pytest.raises(InputError, match="estimates must be one of profiles, fitted"):
        make_policy("sia", estimates="oracle")


def test_pollux_with_fitted_estimates_believes_what_each_job_measured_whatever_the_type():
    inst = load_sia_instance("sia:mini/workload-1", FIXTURE)
    pol = make_policy("pollux", estimates="fitted")
    first: dict[tuple, tuple] = {}
    checked = []

    def decide(ctx, inner=pol.decide):
        d = inner(ctx)
        for jid, rec in pol.seen.jobs.items():
            union = {k for t in rec.points for k in rec.points[t]}
            assert set(rec.blind) == union               # every point measured, on any type
            for k, p in rec.blind.items():
                assert first.setdefault((jid, k), p) == p    # the first measurement kept
            checked.append(len(rec.blind))
        return d

    pol.decide = decide
    res = simulate(inst, pol, perf=goodput_perf(None, None, None, inst.oracle), reconfig=reconfig_for(inst, {}),
                   run_out=True, iteration_noise_cv=0.0)
    assert res.summary["jobs_finished_runout"] == len(inst.jobs)
    assert max(checked) >= 2
    _, _, profiles = _run("pollux")
    assert [j.jct_s for j in res.jobs] != [j.jct_s for j in profiles.jobs]   # it decides from the fit
    with pytest.raises(InputError, match="estimates must be one of profiles, fitted"):
        make_policy("pollux", estimates="oracle")
