"""Nodes out of service: drained for maintenance or down (instances/outages.py,
``RoundLoop.set_unavailable``). Every policy keeps every job off an unavailable node (the
invariants assert it every round), the jobs evicted from it keep their progress and
finish elsewhere, and the capacity the policies decide with shrinks by the nodes out."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.policy import make_policy
from engine.core.state import StateError
from engine.decide.formulation.round_data import Capacity
from engine.sim.simulator import simulate
from instances.builtin import get_instance
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from instances.outages import Outage, down_at, load_outages
from tests.test_move_ledger import assert_ledger_consistent

DEMO = get_instance("demo")      # nodes 0-3: 8 x a100-40gb each; 4-11: 2 x a40 each
# jobs arrive over the first 2,940 s: three A100 nodes and two A40 nodes go out while the
# cluster is full, and come back at different times
OUTAGES = (Outage(0, 1500.0, 6000.0), Outage(1, 1800.0, 9000.0), Outage(2, 2400.0, 4000.0),
           Outage(4, 1200.0, 5000.0), Outage(5, 1200.0, 7000.0))


def _perf(policy: str):
    from estimators import make_performance_model
    return None if policy == "fcfs" else make_performance_model("analytic")


@pytest.mark.parametrize("policy", ["arena", "suika", "sia-ap", "gavel-ap", "elasticflow-ls-ap", "fcfs"])
def test_every_policy_keeps_jobs_off_nodes_out_and_finishes_every_job(policy):
    res = simulate(DEMO, make_policy(policy), perf=_perf(policy), run_out=True, outages=OUTAGES)
    s = res.summary
    assert s["jobs_finished_runout"] == len(DEMO.jobs) and s["end_reason"] == "all jobs finished"
    # the invariants (every round) refuse a job on an unavailable node; jobs were there to evict
    assert s["evictions"] >= 1
    assert sum(r.evictions for r in res.rounds) == s["evictions"]
    assert_ledger_consistent(res)           # forced moves and evictions close their ledger entries
    forced = [e for e in res.moves if e.forced]
    assert len(forced) == s["moves_forced"]


def test_nodes_out_lengthen_the_run_and_a_whole_cluster_out_waits_instead_of_stalling():
    base = simulate(DEMO, make_policy("arena"), perf=_perf("arena"), run_out=True).summary
    every = tuple(Outage(n, 3000.0, 3000.0 + 30 * 300.0) for n in range(12))    # longer than the stall limit
    res = simulate(DEMO, make_policy("arena"), perf=_perf("arena"), run_out=True, outages=every)
    s = res.summary
    assert s["jobs_finished_runout"] == len(DEMO.jobs) and s["end_reason"] == "all jobs finished"
    assert s["makespan_runout_s"] > base["makespan_runout_s"]
    t0 = min(j.arrival_s for j in DEMO.jobs)
    during = [r for r in res.rounds if 3000.0 <= r.time_s - t0 < 12000.0]
    assert during and all(r.running == 0 and r.launches == 0 and r.gpus_out == 48 for r in during)
    assert res.rounds[0].gpus_out == 0 and res.rounds[-1].gpus_out == 0


def test_capacity_loses_the_nodes_out_and_keeps_the_levels():
    full = Capacity.from_cluster(DEMO.cluster)
    less = Capacity.from_cluster(DEMO.cluster, frozenset({0, 4, 5}))
    assert less.types == full.types and less.levels == full.levels
    a100, a40 = full.types.index("a100-40gb"), full.types.index("a40")
    assert [b - c for b, c in zip(full.blocks[a100], less.blocks[a100])] == [8, 4, 2, 1]
    assert [b - c for b, c in zip(full.blocks[a40], less.blocks[a40])] == [4, 2]
    gone = Capacity.from_cluster(DEMO.cluster, frozenset(range(4)))
    assert gone.blocks[a100] == (0, 0, 0, 0) and gone.levels == full.levels   # an 8-GPU shape is held at zero


def _fcfs_loop(n_jobs: int):
    from engine.core.reconfig import ReconfigCostModel
    from engine.core.round_loop import RoundLoop
    from engine.sim.sim_executor import SimExecutor
    loop = RoundLoop(DEMO.cluster, make_policy("fcfs"), SimExecutor(DEMO.oracle, ReconfigCostModel()),
                     round_interval_s=300.0, jobs=DEMO.jobs[:n_jobs])
    for j in DEMO.jobs[:n_jobs]:
        loop.submit(j.job_id, 0.0)
    loop.round(0.0, 0)
    return loop


def test_jobs_on_a_node_out_move_elsewhere_or_are_stopped_and_a_bad_node_changes_nothing():
    loop = _fcfs_loop(3)
    running = {j: r.alloc for j, r in loop.state.running.items()}
    assert running
    with pytest.raises(StateError, match="no node 12"):
        loop.set_unavailable({0, 12}, 10.0)
    assert loop.state.cluster.unavailable == frozenset()
    mover = min(running, key=lambda j: running[j].grid.num_gpus)
    held = {n for n, _ in running[mover].gpus}
    assert loop.set_unavailable(held, 10.0) == [mover]
    rec = loop.round(20.0, 1)                            # room elsewhere: it moves, same grid
    with pytest.raises(StateError, match="unavailable"):
        loop.state.cluster.assign("x", ((min(held), 0),))
    assert rec.evictions == 1 == rec.reconfigurations and rec.preemptions == 0
    for jid, r in loop.state.running.items():
        assert r.alloc.grid == running[jid].grid and held.isdisjoint(n for n, _ in r.alloc.gpus)
        assert (r.alloc.gpus == running[jid].gpus) == (jid != mover)   # the others stay put
    r = loop.state.jobs[mover]
    assert r.evictions == 1 and r.changes_total == 0     # not a change the stability rule counts
    # no room left anywhere: the jobs are stopped with their progress and wait
    busy = loop.state.running.copy()
    everything = frozenset(range(len(loop.state.cluster.nodes)))
    loop.set_unavailable(everything, 30.0)
    rec = loop.round(40.0, 2)
    assert rec.evictions == len(busy) and not loop.state.running and rec.preemptions == 0
    assert all(loop.state.jobs[j].evictions == 1 + (j == mover) and loop.state.jobs[j].preemptions == 0
               for j in busy)
    loop.set_unavailable((), 50.0)                       # all back: they resume
    assert loop.round(60.0, 3).launches == len(busy)


def test_outage_file_errors_name_the_file_line_and_field(tmp_path):
    cl = ClusterSpec((NodeGroup("a100", 2, 8, hosts=("h0", "h1")),), "two")
    good = tmp_path / "ok.csv"
    good.write_text("node,start_s,end_s,reason\nh1,100,200,disk\n0,50,,dead\n\n")
    got = load_outages(good, cl)
    assert got == (Outage(0, 50.0, math.inf, "dead"), Outage(1, 100.0, 200.0, "disk"))
    assert down_at(got, 150.0) == {0, 1} and down_at(got, 200.0) == {0} and down_at(got, 10.0) == set()
    for text, line, field in [("nodes,start_s,end_s\n", 1, None),
                              ("node,start_s,end_s\n7,1,2\n", 2, "node"),
                              ("node,start_s,end_s\nh9,1,2\n", 2, "node"),
                              ("node,start_s,end_s\n0,soon,2\n", 2, "start_s"),
                              ("node,start_s,end_s\n0,5,2\n", 2, "end_s"),
                              ("node,start_s,end_s\n0,1,2\n1,nan,3\n", 3, "start_s"),
                              ("node,start_s,end_s\n0,1\n", 2, None),
                              # a fourth column other than reason was read as the reason
                              ("node,start_s,end_s,until\n0,1,2,5\n", 1, None)]:
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(InputError) as e:
            load_outages(bad, cl)
        assert e.value.file == str(bad) and e.value.line == line and e.value.field == field, (text, e.value)
    with pytest.raises(InputError, match="not found"):
        load_outages(tmp_path / "none.csv", cl)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"node,start_s\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):       # the shared CSV reader's check
        load_outages(binary, cl)
    with pytest.raises(InputError, match="not an outage file"):
        load_outages(tmp_path, cl)
    assert cl.node_id("h1") == 1 and cl.node_id(" 0 ") == 0 and cl.node_id(1) == 1
    with pytest.raises(InputError, match="h0, h1"):
        cl.node_id("nope")
    two = ClusterSpec((NodeGroup("a100", 2, 8, hosts=("h", "h")),), "shared")
    with pytest.raises(InputError, match=r"names nodes \[0, 1\]"):
        two.node_id("h")


def test_simulate_cli_takes_an_outage_file_and_checks_it_first(tmp_path, capsys):
    from engine.cli.main import main
    f = tmp_path / "out.csv"
    f.write_text("node,start_s,end_s\n99,0,10\n")
    assert main(["simulate", "--instance", "demo", "--policy", "fcfs", "--outages", str(f), "--quiet",
                 "--no-plots", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "line 2" in err and "no node '99'" in err
    f.write_text("node,start_s,end_s\n0,300,\n")
    assert main(["simulate", "--instance", "demo", "--policy", "fcfs", "--outages", str(f), "--quiet",
                 "--no-plots", "--run-out", "--out", str(tmp_path / "r")]) == 0
    assert "evictions" in capsys.readouterr().out


def test_a_cluster_out_for_good_ends_the_run_out_as_stalled_with_every_job_reported():
    res = simulate(DEMO, make_policy("fcfs"), run_out=True, outages=tuple(Outage(n, 1000.0) for n in range(12)),
                   max_rounds=5000)
    s = res.summary
    assert s["end_reason"] == "stalled"                  # not the safety limit: nothing is to come back
    assert s["jobs_finished_runout"] + s["jobs_unfinished_runout"] == len(DEMO.jobs) and s["jobs_unfinished_runout"]


def test_bench_policies_runs_every_policy_under_the_same_outages(tmp_path, capsys):
    from engine.cli.main import main
    f = tmp_path / "out.csv"
    f.write_text("node,start_s,end_s\n0,1500,6000\n4,1200,5000\n")
    assert main(["bench", "policies", "--instance", "demo", "--policy", "arena", "--policy", "fcfs",
                 "--outages", str(f), "--json", "--quiet"]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"arena", "fcfs"} and all(r["jobs_unfinished_runout"] == 0 for r in rows.values())
    assert sum(r["evictions"] for r in rows.values()) >= 1 and all(r["outages"] == str(f) for r in rows.values())
    f.write_text("node,start_s,end_s\nnode-x,1,2\n")
    assert main(["bench", "policies", "--instance", "demo", "--outages", str(f), "--quiet"]) == 2
    assert "line 2" in capsys.readouterr().err


def test_an_eviction_is_not_a_change_the_stability_rule_counts():
    res = simulate(DEMO, make_policy("arena"), perf=_perf("arena"), run_out=True, outages=OUTAGES)
    evicted = [j for j in res.jobs if j.evictions]
    assert sum(j.evictions for j in res.jobs) == res.summary["evictions"] and evicted
    # its resume is a reconfiguration (it paid a restart), its stop is not a preemption
    assert all(j.reconfigurations >= j.evictions for j in evicted)
    assert sum(j.preemptions for j in res.jobs) == res.summary["preemptions"]


def test_synthetic_outages_are_seeded_poisson_failures_that_the_simulator_reads_back(tmp_path, capsys):
    from engine.cli.main import main
    from instances.outages import synthetic_outages
    big = ClusterSpec((NodeGroup("a100", 400, 8),), "big")
    a = synthetic_outages(big, mtbf_h=100.0, repair_h=2.0, start_s=0.0, hours=50.0, seed=3)
    assert a == synthetic_outages(big, mtbf_h=100.0, repair_h=2.0, start_s=0.0, hours=50.0, seed=3)
    assert a != synthetic_outages(big, mtbf_h=100.0, repair_h=2.0, start_s=0.0, hours=50.0, seed=4)
    # about 400 nodes x 50 h / 100 h = 200 failures (Poisson: within 4 standard deviations)
    assert abs(len(a) - 200) < 4 * 200 ** 0.5
    assert all(0.0 <= o.start_s < 50 * 3600 and o.end_s > o.start_s for o in a)
    repairs = [(o.end_s - o.start_s) / 3600 for o in a]
    assert 1.5 < sum(repairs) / len(repairs) < 2.6
    per_node: dict[int, list] = {}
    for o in a:
        per_node.setdefault(o.node, []).append(o)
    assert all(x.end_s <= y.start_s for os_ in per_node.values() for x, y in zip(os_, os_[1:]))  # one at a time
    f = tmp_path / "gen.csv"
    assert main(["outages", "--instance", "demo", "--mtbf-hours", "5", "--repair-hours", "1", "--hours", "5",
                 "--seed", "1", "--out", str(f)]) == 0
    got = load_outages(f, DEMO.cluster)
    assert got and got == synthetic_outages(DEMO.cluster, mtbf_h=5, repair_h=1, start_s=0.0, hours=5, seed=1)
    assert main(["outages", "--instance", "demo", "--mtbf-hours", "-1", "--repair-hours", "1", "--hours", "5",
                 "--out", str(f)]) == 2
    assert "field '--mtbf-hours'" in capsys.readouterr().err


outage_lists = st.lists(st.tuples(st.integers(0, 11), st.floats(0, 8000), st.one_of(st.none(), st.floats(60, 6000))),
                        max_size=8)


@settings(max_examples=12, deadline=None)
@given(outage_lists, st.sampled_from(["arena", "sia-ap", "fcfs"]))
def test_random_outages_keep_every_invariant_and_lose_no_job(spans, policy):
    """Any schedule of outages (overlapping, permanent, on any node): the invariants hold
    every round (the loop asserts them, a job on a node out included), and every job ends
    finished or reported unfinished, none lost."""
    from dataclasses import replace
    small = replace(DEMO, jobs=DEMO.jobs[:14])
    outages = tuple(Outage(n, s, math.inf if d is None else s + d) for n, s, d in spans)
    res = simulate(small, make_policy(policy), perf=_perf(policy), run_out=True, outages=outages, max_rounds=3000)
    s = res.summary
    assert s["end_reason"] in ("all jobs finished", "stalled")
    assert s["jobs_finished_runout"] + s["jobs_unfinished_runout"] == len(small.jobs)
    assert len(res.jobs) == len(small.jobs)
    assert_ledger_consistent(res)
    if not any(o.end_s == math.inf for o in outages):
        assert s["end_reason"] == "all jobs finished"       # every node came back: every job finished


def test_synthetic_outages_never_end_before_they_start_and_absurd_options_are_refused_up_front(tmp_path, capsys):
    from engine.cli.main import main
    from instances.outages import MAX_SYNTHETIC_OUTAGES, synthetic_outages
    short = synthetic_outages(DEMO.cluster, mtbf_h=24.0, repair_h=0.01, start_s=0.0, hours=1000.0, seed=0)
    assert len(short) > 100 and all(o.end_s > o.start_s for o in short)
    assert min(o.end_s - o.start_s for o in short) == pytest.approx(0.1)       # a repair shorter than 0.1 s
    per_node: dict[int, list] = {}
    for o in short:
        per_node.setdefault(o.node, []).append(o)
    assert all(x.end_s <= y.start_s for os_ in per_node.values() for x, y in zip(os_, os_[1:]))
    for kw, field in ((dict(hours=1e12), "hours"), (dict(mtbf_h=1e-6, repair_h=1e-6), "mtbf_h"),
                      (dict(hours=1e7), "mtbf_h")):
        args = dict(mtbf_h=24.0, repair_h=1.0, start_s=0.0, hours=1000.0, seed=0) | kw
        with pytest.raises(InputError) as e:
            synthetic_outages(DEMO.cluster, **args)
        assert e.value.field == field, kw
    assert MAX_SYNTHETIC_OUTAGES == 1_000_000
    f = tmp_path / "new" / "o.csv"                      # a folder that is not there yet is made
    for argv, flag in ((["--mtbf-hours", "24", "--repair-hours", "1", "--hours", "1e12"], "--hours"),
                       (["--mtbf-hours", "1e-6", "--repair-hours", "1e-6", "--hours", "1000"], "--mtbf-hours")):
        assert main(["outages", "--instance", "demo", *argv, "--out", str(f)]) == 2
        err = capsys.readouterr().err
        assert f"field '{flag}'" in err and "end_s" not in err and "Traceback" not in err
    assert not (tmp_path / "new").exists()              # a refused run leaves nothing behind
    assert main(["outages", "--instance", "demo", "--mtbf-hours", "24", "--repair-hours", "0.01", "--hours", "1000",
                 "--out", str(f)]) == 0
    assert load_outages(f, DEMO.cluster)
