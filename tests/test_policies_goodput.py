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


def test_arena_decides_goodput_jobs_with_its_goodput_preset():
    # the utility term alone, no stability rule there; its fixed-batch objective elsewhere;
    # an option of a term on for one kind only reaches that kind's objective
    pol = make_policy("arena", **{"utility.p": -1.0, "jct.exponent": 2.0})
    fixed, goodput = pol._fixed_knobs, pol._goodput_knobs
    assert {t.name for _, t in fixed.objective.terms} == {"throughput", "jct", "queue", "reconfig"}
    assert [(w, t.name, t.p, t.move_horizon) for w, t in goodput.objective.terms] == [(1.0, "utility", -1.0, "age")]
    assert [t.exponent for _, t in fixed.objective.terms if t.name == "jct"] == [2.0]
    assert fixed.stability.enabled and not goodput.stability.enabled
    assert goodput.held_rows and not fixed.held_rows           # the held rows on goodput jobs only
    both = make_policy("arena", held_rows=False)                # (an option given applies to both kinds)
    assert not both._goodput_knobs.held_rows and not both._fixed_knobs.held_rows
    _, rec, res = _run("arena", **{"utility.p": -1.0})
    assert all(j.jct_s is not None for j in res.jobs) and any(d.grids for _, d in rec.rounds)
    # the goodput rounds' objectives are the utility's: at most bonus (1.1) per job run
    for _, d in rec.rounds:
        if d.stats.objective is not None:
            assert d.stats.objective <= 1.1 * d.stats.jobs + 1e-6


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


# ------------------------------------------------ options and the instance (issue 58)
def _workload(name: str = "sia:mini/workload-1"):
    from engine.cli.common import instance_workload
    from instances.builtin import get_instance
    inst = load_sia_instance(name, FIXTURE) if name.startswith("sia:") else get_instance(name)
    return instance_workload(inst, run_out=True)


@pytest.mark.parametrize("policy, opts, instance, words", [
    ("sia", {"w_jct": 1}, "sia:mini/workload-1", "option w_jct is not read on instance 'sia:mini/workload-1' (the "
                                                 "Sia artifact's goodput jobs): there SiaGoodput decides, which reads"),
    ("sia", {"threads": 2}, "sia:mini/workload-1", "option threads is not read on instance 'sia:mini/workload-1'"),
    ("sia-ap", {"max_gpus": 8}, "sia:mini/workload-1", "option max_gpus is not read"),
    ("gavel", {"w_las": 2}, "sia:mini/workload-1", "there GavelGoodput decides, which reads round_s, share_ties"),
    ("gavel", {"round_s": 100}, "demo", "option round_s is not read on instance 'demo' (fixed-batch jobs): it is "
                                        "read only on the Sia artifact's goodput jobs"),
    ("sia", {"estimates": "fitted"}, "demo", "option estimates is not read on instance 'demo'"),
    ("sia", {"lambda_n": 2, "clip": 10}, "demo", "option clip is not read on instance 'demo'"),
    ("arena", {"utility.weight": "remaining"}, "demo", "option utility.weight is not read on instance 'demo' "
                                                       "(fixed-batch jobs): it is read only on the Sia artifact's"),
    ("arena", {"jct.exponent": 2}, "sia:mini/workload-1", "its term is off in the policy's goodput preset there"),
])
def test_an_option_the_policy_would_not_read_on_the_instance_is_refused(policy, opts, instance, words):
    """B1: each of these ran exactly as without the option."""
    from engine.cli.common import build_policy, check_policy_on
    with pytest.raises(InputError) as e:
        check_policy_on(build_policy(policy, opts), _workload(instance))
    assert e.value.field == "--policy-opt" and f"policy {policy!r}: " in str(e.value) and words in str(e.value)


def test_options_read_on_the_instance_pass_and_shared_ones_reach_both_deciders():
    from engine.cli.common import build_policy, check_policy_on
    for policy, opts, instance in (("sia", {"p": -1, "estimates": "fitted", "max_queued": 3}, "sia:mini/workload-1"),
                                   ("gavel", {"round_s": 120, "event_driven": True}, "sia:mini/workload-1"),
                                   ("arena", {"w_jct": 2, "threads": 1}, "sia:mini/workload-1"),
                                   ("arena", {"utility.weight": "attained", "jct.exponent": 2, "w_jct": 1},
                                    "sia:mini/workload-1"),
                                   ("arena", {"jct.exponent": 2, "reconfig.give_way": 1}, "demo"),
                                   ("sia", {"time_limit_s": 5, "w_jct": 1}, "demo")):
        check_policy_on(build_policy(policy, opts), _workload(instance))
    # sia's time_limit_s went to its goodput policy alone: on fixed-batch jobs the MILP ignored it
    pol = build_policy("sia", {"time_limit_s": 5, "rel_gap": 0.2})
    assert (pol.time_limit_s, pol.rel_gap, pol._goodput.time_limit_s, pol._goodput.rel_gap) == (5, 0.2, 5, 0.2)


def test_policies_that_cannot_decide_the_instance_are_refused_before_any_round():
    from engine.cli.common import build_policy, check_policy_on
    from engine.core.policy import Workload
    for policy, workload, words in (("pollux", _workload("demo"), "decides only the Sia artifact's adaptive-batch "
                                                                  "goodput jobs (--instance sia:TRACE/WORKLOAD), not "
                                                                  "the fixed-batch jobs of instance 'demo'"),
                                    ("pollux-artifact", Workload("the live service"), "of the live service"),
                                    ("elasticflow-ls", _workload(), "have no model architecture")):
        with pytest.raises(InputError) as e:
            check_policy_on(build_policy(policy, {}), workload)
        assert e.value.field == "--policy" and words in str(e.value), str(e.value)
    # the live service's one call at start (engine/cli/commands/service.py): fixed-batch jobs
    with pytest.raises(InputError, match="option estimates is not read on the live service"):
        check_policy_on(build_policy("sia", {"estimates": "fitted"}), Workload("the live service"))


@pytest.mark.parametrize("argv, words", [
    (["simulate", "--instance", "sia:mini/workload-1", "--sia-artifact", str(FIXTURE), "--policy", "sia",
      "--policy-opt", "w_jct=1"], "field '--policy-opt': policy 'sia': option w_jct is not read on instance"),
    (["simulate", "--instance", "sia:mini/workload-1", "--sia-artifact", str(FIXTURE), "--policy", "sia",
      "--dump-rounds", "DUMP"], "field '--dump-rounds': policy 'sia': option dump_rounds_dir is not read"),
    (["simulate", "--instance", "sia:mini/workload-1", "--sia-artifact", str(FIXTURE), "--policy", "fcfs",
      "--shadow-policy", "gavel", "--shadow-policy-opt", "w_las=2"], "field '--shadow-policy-opt': policy 'gavel'"),
    (["bench", "policies", "--instance", "demo", "--policy", "fcfs", "--policy", "g=gavel", "--policy-opt",
      "g:round_s=100", "--rounds", "2"], "field '--policy-opt': label 'g': policy 'gavel': option round_s is not read"),
])
def test_the_commands_refuse_an_unread_option_before_any_round(argv, words, capsys, tmp_path):
    from engine.cli.main import main
    argv = [str(tmp_path / "dump") if a == "DUMP" else a for a in argv]
    assert main(argv + ["--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()                     # refused before anything ran


@pytest.mark.parametrize("policy, opts, words", [
    ("gavel", {"round_s": 1e300}, "round_s must be a finite number in [1, 86400] (Gavel's round"),      # B2
    ("gavel", {"round_s": 1e12}, "got 1000000000000.0"),
    ("sia", {"p": 10**54}, "p must be a finite number in [-10, 10], not 0 (Sia's fairness exponent; its artifact "
                           "runs -0.5), got 1e+54"),                                                        # B3
    ("sia", {"p": 10**400}, "got an integer of about 400 digits"),
    ("pollux", {"p": -10}, "p must be a finite number in [-4, 10], not 0 (Pollux's power-mean exponent"),   # B4
    ("pollux", {"max_replicas": 1.5}, "max_replicas must be a whole number, got 1.5"),                      # B5
    ("pollux-artifact", {"generations": 100000}, "generations must be a whole number in 1..1,000"),          # B6
    ("pollux-artifact", {"population": 100000}, "population must be a whole number in 2..1,000"),            # B7
    ("pollux-artifact", {"population": 1000, "generations": 1000}, "generations x population is 1,000,000 "
                                                                   "evaluations a round, more than 100,000"),
    ("pollux", {"generations": 10}, "option generations is not read with search=exact"),
    ("pollux-artifact", {"time_limit_s": 10}, "option time_limit_s is not read with search=ga"),
    ("sia", {"clip": 0}, "clip must be a finite number in [1, 1e+09]"),                                     # B8
    ("sia", {"lambda_n": -1e6, "p": -0.5}, "lambda_n -1e+06 with p -0.5: lambda_n must be > 1 (the price of a job "
                                          "left out must outweigh"),
    ("sia", {"lambda_n": 1.1, "p": 0.5}, "lambda_n 1.1 with p 0.5: lambda_n must be < -1"),
    ("arena", {"move_budget_jobs": 0.5}, "option move_budget_jobs is not read with search=milp"),
    ("arena-incremental", {"time_limit_s": 5}, "option time_limit_s is not read with search=incremental"),
    ("elasticflow-ls", {"max_gpus": 1.5}, "max_gpus must be a whole number, got 1.5"),
    ("fcfs", {"block_scope": "gpu_type"}, "block_scope is read only with backfill=false"),
])
def test_bad_policy_options_are_refused_with_their_range(policy, opts, words):
    from engine.cli.common import build_policy
    with pytest.raises(InputError) as e:
        build_policy(policy, opts)
    assert e.value.field == "--policy-opt" and words in str(e.value), str(e.value)


def test_one_bound_per_value_whether_it_comes_from_the_artifact_or_the_command_line(tmp_path):
    """The artifact's sia_default_p_val and --policy-opt p are held to the same bound,
    said in the same words (instances/limits.py, SIA_P)."""
    import shutil

    from instances import sia_artifact, sia_instances
    from instances.limits import SIA_P
    root = tmp_path / "art"
    shutil.copytree(FIXTURE, root)
    cfg = root / "sia-simulator" / "simulator_config.py"
    cfg.write_text(cfg.read_text().replace("sia_default_p_val = -0.5", "sia_default_p_val = 0"))
    sia_artifact.forget_loaded()
    sia_instances.sia_world.cache_clear()
    with pytest.raises(InputError) as artifact:
        load_sia_instance("sia:mini/workload-1", root)
    sia_artifact.forget_loaded()
    sia_instances.sia_world.cache_clear()
    with pytest.raises(InputError) as option:
        make_policy("sia", p=0)
    assert SIA_P.describe() in str(artifact.value) and SIA_P.describe() in str(option.value)
    # an option and the artifact's default it combines with: checked together, before any round
    from engine.cli.common import build_policy, check_policy_on
    with pytest.raises(InputError, match=r"lambda_n 1.1 with p 0.5 \(one from --policy-opt, the other the "
                                         r"artifact's sia_default_p_val / sia_default_lambda_n\)"):
        check_policy_on(build_policy("sia", {"p": 0.5}), _workload())


def test_a_gavel_round_longer_than_the_stall_window_is_refused_on_a_run_out():
    """B2: a 1e12 s round held every job after the first for ever (the run-out stalled)."""
    from engine.cli.common import build_policy, check_policy_on
    window = _workload().idle_limit_s
    assert window == 20 * 60.0
    check_policy_on(build_policy("gavel", {"round_s": window}), _workload())
    with pytest.raises(InputError, match=r"round_s 1300 s is longer than the 1200 s a run of instance "
                                         r"'sia:mini/workload-1' waits with jobs queued"):
        check_policy_on(build_policy("gavel", {"round_s": 1300}), _workload())


@pytest.mark.parametrize("policy, opts", [("sia", {"p": 0.5, "lambda_n": -1.1}), ("pollux", {"p": 1.0}),
                                          ("pollux", {"restart_delay_s": 0}),
                                          ("pollux", {"p": -4.0}),
                                          ("pollux", {"p": 2.0, "search": "ga", "generations": 10, "population": 10})])
def test_a_positive_or_extreme_exponent_still_runs_every_job(policy, opts):
    """p > 0 maximizes (it minimized: nothing ran, the run-out stalled); p = -4, the
    bound, still solves (p = -10 stopped HiGHS at status 15); restart_delay_s=0 (found by
    the options' fuzz test: 0 / 0 in the restart factor of a job at its arrival)."""
    inst, _, res = _run(policy, **opts)
    assert res.summary["jobs_finished_runout"] == len(inst.jobs)
