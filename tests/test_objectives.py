"""Each objective term changes decisions the way it should, on tiny rounds solved by
every available backend."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.decide.formulation import build_model, tiny_round_data
from engine.decide.objectives import make_term, parse_objective, term_names
from engine.decide.solvers import available_backends, make_backend
from instances.errors import InputError

BACKENDS = [b for b in available_backends() if b != "greedy"]
HEURISTIC = {"highs-lp", "lagrangian"}      # prove a gap, not optimality: status may be "feasible"


class Unproved(dict):
    """A heuristic's decision that it did not prove optimal (compares equal to anything)."""

    def __eq__(self, other):
        return True


def decide(data, weights, backend, **options):
    obj = parse_objective(options, weights)
    model = build_model(data, obj)
    sol = make_backend(backend).solve(model, 20.0, rel_gap=1e-6)
    assert model.violation(sol.values) <= 1e-6
    got = {data.job_ids[data.col_job[k]]: int(k) for k in sol.selected(model.n_x)}
    if sol.status == "optimal":
        return got
    # a heuristic may stop short of optimal, but then it must say so with a valid bound
    assert backend in HEURISTIC and sol.status == "feasible", sol.message
    exact = make_backend("highs").solve(model, 20.0, rel_gap=1e-9)
    opt = exact.objective - model.offset
    assert sol.bound >= opt - 1e-6 and sol.objective - model.offset <= opt + 1e-6
    assert sol.gap > 1e-6
    return Unproved(got)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def test_throughput_prefers_the_faster_type(backend):
    data = tiny_round_data({"a100": [4], "a10": [4]},
                           [{"cols": [("a10", 1, 1, 1.0), ("a100", 1, 1, 3.0)]}])
    assert decide(data, {"throughput": 1}, backend) == {"j0": 1}


def test_jct_favours_short_remaining_work(backend):
    jobs = [{"cols": [("a100", 1, 1, 1.0)], "remaining": 10_000},
            {"cols": [("a100", 1, 1, 1.0)], "remaining": 100}]
    data = tiny_round_data({"a100": [1]}, jobs)
    assert decide(data, {"jct": 1}, backend) == {"j1": 1}     # global column index


def test_makespan_favours_the_longest_remaining_work(backend):
    jobs = [{"cols": [("a100", 1, 1, 1.0)], "remaining": 10_000},
            {"cols": [("a100", 1, 1, 1.0)], "remaining": 100}]
    data = tiny_round_data({"a100": [1]}, jobs)
    assert decide(data, {"makespan": 1}, backend) == {"j0": 0}
    # beside jct it is the counterweight: enough of it gives the one GPU to the long job
    assert decide(data, {"jct": 1}, backend) == {"j1": 1}
    assert decide(data, {"jct": 1, "makespan": 200}, backend) == {"j0": 0}


def test_makespan_coefficients_follow_the_formula():
    from engine.decide.formulation.model import ModelBuilder
    jobs = [{"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 1.8)], "remaining": 1000},
            {"cols": [("a100", 1, 1, 1.0)], "remaining": 500}]
    data = tiny_round_data({"a100": [2]}, jobs)
    b = ModelBuilder(data.n_cols, data.col_job, data.n_jobs)
    make_term("makespan", exponent=2.0, basis="reference").apply(data, b, 3.0)
    t = data.remaining_time_ref_s
    want = 3.0 * data.speedup * ((t / t.max()) ** 2)[data.col_job]
    np.testing.assert_allclose(b.build().c[: data.n_cols], want)
    with pytest.raises(InputError):
        make_term("makespan", exponent=-1)
    with pytest.raises(InputError):
        make_term("makespan", basis="slowest")
    b = ModelBuilder(data.n_cols, data.col_job, data.n_jobs)
    make_term("makespan").apply(data, b, 3.0)                  # basis "fastest", the default
    t = data.remaining_time_ref_s / np.array([1.8, 1.0])        # at each job's fastest column
    want = 3.0 * data.speedup * ((t / t.max()) ** 2)[data.col_job]
    np.testing.assert_allclose(b.build().c[: data.n_cols], want)


def test_makespan_on_the_fastest_basis_favours_the_job_that_scales_worst(backend):
    # 4 GPUs, room for one job: j0 has more work but runs 4x faster on them (fastest
    # finish 250 s), j1 less work but no speed-up (800 s): j1 is the one that sets the makespan
    jobs = [{"cols": [("a100", 1, 4, 4.0)], "remaining": 1000, "ref": 1.0},
            {"cols": [("a100", 1, 4, 1.0)], "remaining": 800, "ref": 1.0}]
    data = tiny_round_data({"a100": [4]}, jobs)
    assert decide(data, {"makespan": 1}, backend) == {"j1": 1}
    assert decide(data, {"makespan": 1}, backend, **{"makespan.basis": "reference"}) == {"j0": 0}


def test_queue_penalty_runs_more_jobs(backend):
    # job 0 scales well: 4 GPUs give 3.6x; jobs 1-3 fit on one GPU each
    jobs = [{"cols": [("a100", 1, 1, 1.0), ("a100", 1, 4, 3.6)]}] + \
           [{"cols": [("a100", 1, 1, 0.5)], "ref": 1.0} for _ in range(3)]
    data = tiny_round_data({"a100": [4]}, jobs)
    without = decide(data, {"throughput": 1}, backend)
    assert without == {"j0": 1}
    with_q = decide(data, {"throughput": 1, "queue": 1}, backend)
    assert set(with_q) == {"j0", "j1", "j2", "j3"}


def test_reconfig_penalty_keeps_the_current_grid(backend):
    # running on a10; a100 is 10% faster but the move costs a whole round of downtime
    data = tiny_round_data({"a100": [1], "a10": [1]},
                           [{"cols": [("a10", 1, 1, 1.0), ("a100", 1, 1, 1.1, 300.0)], "current": 0}])
    assert decide(data, {"throughput": 1}, backend) == {"j0": 1}
    assert decide(data, {"throughput": 1, "reconfig": 1}, backend) == {"j0": 0}


def test_reconfig_per_move_damps_small_gains(backend):
    data = tiny_round_data({"a100": [1], "a10": [1]},
                           [{"cols": [("a10", 1, 1, 1.0), ("a100", 1, 1, 1.1, 0.0)], "current": 0}])
    assert decide(data, {"throughput": 1, "reconfig": 1}, backend) == {"j0": 1}
    assert decide(data, {"throughput": 1, "reconfig": 1}, backend, **{"reconfig.per_move": 0.2}) == {"j0": 0}


@pytest.mark.parametrize("kind", ["maxmin", "power"])
def test_fairness_splits_gpus(backend, kind):
    # job 0 scales linearly, job 1 not at all beyond one GPU; 2 GPUs
    jobs = [{"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 2.0)]},
            {"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 1.0)]}]
    data = tiny_round_data({"a100": [2]}, jobs)
    # throughput alone is indifferent between {j0 on 2} and {j0, j1 on 1}: both 2.0;
    # tilt it towards j0 a little, then fairness must undo the tilt
    jobs[0]["cols"][1] = ("a100", 1, 2, 2.2)
    data = tiny_round_data({"a100": [2]}, jobs)
    assert decide(data, {"throughput": 1}, backend) == {"j0": 1}
    fair = decide(data, {"throughput": 1, "fairness": 1}, backend, **{"fairness.kind": kind})
    assert fair == {"j0": 0, "j1": 2}


def test_deadline_penalty_and_constraint(backend):
    # 1 GPU meets nobody's deadline; 2 GPUs meet job 0's (1000 it at 2 it/s = 500 s)
    jobs = [{"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 2.0)], "deadline_s": 600.0, "ref": 2.0},
            {"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 2.2)], "ref": 1.0}]
    data = tiny_round_data({"a100": [2]}, jobs)
    assert decide(data, {"throughput": 1}, backend) == {"j1": 3}
    assert decide(data, {"throughput": 1, "deadline": 5}, backend) == {"j0": 1}
    assert decide(data, {"throughput": 1, "deadline": 1}, backend, **{"deadline.mode": "constraint"}) == {"j0": 1}


def test_quota_caps_a_tenant(backend):
    jobs = [{"cols": [("a100", 1, 1, 1.0), ("a100", 1, 4, 4.0)], "tenant": "a"},
            {"cols": [("a100", 1, 1, 0.5)], "tenant": "b", "ref": 1.0}]
    data = tiny_round_data({"a100": [4]}, jobs)
    assert decide(data, {"throughput": 1}, backend) == {"j0": 1}
    capped = decide(data, {"throughput": 1, "quota": 1}, backend, **{"quota.quotas": "a=2"})
    assert capped == {"j0": 0, "j1": 2}


def test_las_favours_the_job_that_got_less(backend):
    jobs = [{"cols": [("a100", 1, 1, 1.0)], "attained_gpu_s": 100_000.0},
            {"cols": [("a100", 1, 1, 1.0)], "attained_gpu_s": 0.0}]
    data = tiny_round_data({"a100": [1]}, jobs)
    assert decide(data, {"las": 1}, backend) == {"j1": 1}


def test_utility_coefficients_are_sias_bounded_power_of_normalized_speedup():
    # speedups over the fewest-GPU column: 1, 1.6, 3.0; Sia's p = -0.5 and lambda_n = 1.1
    jobs = [{"cols": [("a100", 1, 1, 2.0), ("a100", 1, 2, 3.2), ("a100", 1, 4, 6.0)], "ref": 3.2}]
    data = tiny_round_data({"a100": [4]}, jobs)
    model = build_model(data, parse_objective({"w_utility": 1.0}, {}))
    assert np.allclose(model.c[:3], [1.1 - 1.0, 1.1 - 1.6 ** -0.5, 1.1 - 3.0 ** -0.5])
    # normalized by the requested reference instead (the job's ref: 3.2 samples/s)
    model = build_model(data, parse_objective({"w_utility": 1.0, "utility.reference": "requested", "utility.p": -1},
                                              {}))
    assert np.allclose(model.c[:3], [1.1 - 1.6, 1.1 - 1.0, 1.1 - 3.2 / 6.0])


def test_utility_shares_gpus_where_summed_throughput_piles_them_on_one_job(backend):
    # 4 GPUs; job 0 gives 1.7x on 2 GPUs and 3.6x on 4, job 1 1.7x on 2: summed speedup
    # gives job 0 all four (3.6 against 3.4), the concave utility two each
    # (2 x (1.1 - 1.7 ** -0.5) = 0.67 against 1.1 - 3.6 ** -0.5 = 0.57)
    jobs = [{"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 1.7), ("a100", 1, 4, 3.6)]},
            {"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 1.7)]}]
    data = tiny_round_data({"a100": [4]}, jobs)
    assert decide(data, {"throughput": 1}, backend) == {"j0": 2}
    assert decide(data, {"utility": 1}, backend) == {"j0": 1, "j1": 4}


def test_utility_amortizes_a_move_over_the_jobs_age(backend):
    # running on 1 GPU; 2 GPUs give 1.9x, the move costs 200 s of downtime: a job that has
    # run an hour moves (200 s of 3,600 is little), one that arrived a round ago does not
    jobs = [{"cols": [("a100", 1, 1, 1.0), ("a100", 1, 2, 1.9, 200.0)], "current": 0}]
    for age_s, moved in ((3600.0, True), (300.0, False)):
        data = tiny_round_data({"a100": [2]}, jobs, now_s=age_s)
        assert decide(data, {"utility": 1}, backend) == {"j0": 1 if moved else 0}
    # with the move priced over one round only, even the old job stays
    data = tiny_round_data({"a100": [2]}, jobs, now_s=3600.0)
    assert decide(data, {"utility": 1}, backend, **{"utility.move_horizon": "round"}) == {"j0": 0}


def test_utility_charges_a_preemption_the_resume_it_will_cost(backend):
    # one GPU; j0 runs there (arrived 600 s ago, resuming would cost 300 s), j1 is queued
    # and worth a little more (its 1 GPU is 1.05x j0's reference): the utility alone swaps
    # them; with the resume charged, j0 keeps its GPU
    from dataclasses import replace
    jobs = [{"cols": [("a100", 1, 1, 1.0)], "current": 0}, {"cols": [("a100", 1, 1, 1.05)], "ref": 1.0}]
    data = tiny_round_data({"a100": [1]}, jobs, now_s=600.0)
    data = replace(data, resume_s=np.array([300.0, 0.0]))
    opts = {"utility.reference": "requested"}
    assert decide(data, {"utility": 1}, backend, **opts) == {"j1": 1}
    assert decide(data, {"utility": 1}, backend, **opts, **{"utility.preemption": True}) == {"j0": 0}


@pytest.mark.parametrize("weight, key, favoured", [("attained", "attained_gpu_s", "j1"),
                                                    ("remaining", "remaining", "j1")])
def test_utility_weights_favour_the_job_that_got_less_or_has_less_left(backend, weight, key, favoured):
    # two jobs, one GPU: j0 got (or has left) much more than j1
    jobs = [{"cols": [("a100", 1, 1, 1.0)], key: 100_000.0}, {"cols": [("a100", 1, 1, 1.0)], key: 10.0}]
    data = tiny_round_data({"a100": [1]}, jobs)
    assert set(decide(data, {"utility": 1}, backend, **{"utility.weight": weight})) == {favoured}


def test_bad_utility_options_are_refused_with_the_field():
    for key, bad in (("utility.p", "0"), ("utility.p", "0.5"), ("utility.bonus", "-1"), ("utility.weight", "age"),
                     ("utility.move_horizon", "forever"), ("utility.exponent", "11"), ("utility.max_speedup", "0.5")):
        with pytest.raises(InputError) as e:
            parse_objective({"w_utility": 1, key: bad}, {})
        assert key in str(e.value)


def test_every_registered_term_has_a_test():
    # terms are discovered from engine/decide/objectives/; a new one needs only its module and a
    # test that names it (in quotes) somewhere under tests/
    from pathlib import Path
    text = "\n".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    names = term_names()
    assert {"throughput", "jct", "queue", "reconfig"} <= set(names)
    untested = [n for n in names if f'"{n}"' not in text]
    assert not untested, f"objective terms without a test: {untested}"


def test_bad_objective_config_is_rejected_with_the_field():
    with pytest.raises(InputError, match="w_nope"):
        parse_objective({"w_nope": 1}, {})
    with pytest.raises(InputError, match="fairness.kind"):
        make_term("fairness", kind="median")
    with pytest.raises(InputError, match="jct.bogus"):
        make_term("jct", bogus=1)
    with pytest.raises(InputError, match="w_jct"):
        parse_objective({"w_jct": -1}, {})
    with pytest.raises(InputError):
        parse_objective({"quota.quotas": "a=x"}, {"quota": 1})
    obj = parse_objective({"w_jct": "2.5", "jct.exponent": "0.5"}, {"throughput": 1})
    assert {t.name: w for w, t in obj.terms} == {"throughput": 1.0, "jct": 2.5}
    assert dict(obj.terms[1][1].__dict__)["exponent"] == 0.5


def test_queue_offset_makes_the_objective_a_penalty():
    data = tiny_round_data({"a100": [1]}, [{"cols": [("a100", 1, 1, 1.0)]}, {"cols": [("a100", 1, 1, 1.0)]}])
    model = build_model(data, parse_objective({}, {"queue": 1}))
    v = np.zeros(model.n_vars)
    v[0] = 1
    assert model.objective_value(v) == pytest.approx(-1.0)     # one of two jobs waits


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=False, min_value=1e-9, max_value=1e12), st.sampled_from([1.0, 2.0, 3.0]),
                          st.just(math.inf), st.just(math.nan)), min_size=1, max_size=40))
def test_the_jct_terms_median_is_numpys_to_the_bit(values):
    """The `jct` term's median (its own, for speed) against ``np.median`` on the same
    array: odd and even sizes, ties, infinities and nans."""
    from engine.decide.objectives.jct import median
    a = np.array(values)
    want = float(np.median(a))
    got = median(a)
    assert (math.isnan(got) and math.isnan(want)) or struct.pack("<d", got) == struct.pack("<d", want)
