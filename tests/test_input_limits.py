"""The bounds on numeric and size input (``instances/limits.py``, issue 46): times past
9e12 s, cluster sizes at the documented limit, solver threads, gzip bombs, deeply nested
JSON and TOML, horizons past the safety limit, objective coefficients that overflow, and
Ctrl-C during a run. Each case was a hang, a blow-up, a traceback or a run that ended
without results; each is now a clear error before the work starts, or results written."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli.main import main
from instances.errors import InputError
from instances.limits import MAX_NESTING_DEPTH, MAX_TIME_S

BOUND = "must be <= 9e12 s (about 285,000 years; beyond it float time loses millisecond precision)"
OURS = ("# arena-trace v1\njob_id,model,global_batch,num_iterations,arrival_s,deadline_s,priority,tenant,"
        "requested_gpu_type,requested_gpus\n")
ARENA = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
PHILLY = "timestamp,duration,num_gpus,gpu_time,cluster\n"
ROOT = Path(__file__).resolve().parents[1]


def _cluster(tmp_path: Path) -> Path:
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 2, "gpus_per_node": 4}]}))
    return p


def _ours(tmp_path: Path, *rows: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(OURS + "".join(r + "\n" for r in rows))
    return p


def _simulate(tmp_path, trace, *extra) -> list[str]:
    return ["simulate", "--cluster", str(_cluster(tmp_path)), "--trace", str(trace), "--out",
            str(tmp_path / "o"), "--quiet", "--no-plots", *extra]


# ------------------------------------------------------------------------------ times
@pytest.mark.parametrize("fmt,text,line,field", [
    ("ours", OURS + "j1,gpt__1.3B,32,100,1e19,,1.0,default,a100,2\n", 3, "arrival_s"),
    ("ours", OURS + "j1,gpt__1.3B,32,100,1e17,,1.0,default,a100,2\n", 3, "arrival_s"),
    ("ours", OURS + "j1,gpt__1.3B,32,100,0,1e300,1.0,default,a100,2\n", 3, "deadline_s"),
    ("arena", ARENA + "1,1e19,100,gpt__1.3B,2e19,32,2,a100\n", 2, "submission_time"),
    ("arena", ARENA + "1,0,100,gpt__1.3B,1e18,32,2,a100\n", 2, "deadline"),
    ("philly", PHILLY + "1e19,60,1,60,vc\n", 2, "timestamp"),
    ("philly", PHILLY + "2017-10-09 07:01:55,1e19,1,60,vc\n", 2, "duration"),
])
def test_a_time_past_the_bound_is_refused_in_every_trace_format(tmp_path, fmt, text, line, field):
    from instances.traces import load_trace
    p = tmp_path / f"{fmt}.csv"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_trace(p)
    assert (e.value.file, e.value.line, e.value.field) == (str(p), line, field), str(e.value)
    assert BOUND in str(e.value)


def test_a_time_at_the_bound_is_taken():
    from instances.traces import parse_trace
    (j,) = parse_trace(OURS + f"j1,gpt__1.3B,32,100,{MAX_TIME_S!r},{MAX_TIME_S!r},1.0,default,a100,2\n")
    assert j.arrival_s == j.deadline_s == MAX_TIME_S


def test_arrivals_past_the_bound_end_at_once_with_the_bound_named(tmp_path, capsys):
    """Was an endless loop, even with --rounds 3: t + duration rounded back to t."""
    trace = _ours(tmp_path, "j1,gpt__1.3B,32,100,1e19,,1.0,default,a100,2")
    assert main(_simulate(tmp_path, trace, "--rounds", "3")) == 2
    err = capsys.readouterr().err
    assert f"t.csv, line 3, field 'arrival_s': {BOUND}, got 1e19" in err, err


@pytest.mark.parametrize("extra,flag", [
    (["--round-interval", "1e20"], "--round-interval"),
    (["--round-interval", "1e-9"], "--round-interval"),   # below float time's resolution at the clock
    (["--rounds", "2000000"], "--rounds"),                 # past the safety limit, without --max-rounds
    (["--rounds", "2000000", "--max-rounds", "10"], "--rounds"),
    (["--rounds", "40000", "--max-rounds", "100000", "--round-interval", "3e8"], "--rounds"),  # clock past 9e12
])
def test_simulate_refuses_a_clock_past_the_bound_by_its_flag(tmp_path, capsys, extra, flag):
    trace = _ours(tmp_path, "j1,gpt__1.3B,32,100,8.9e12,,1.0,default,a100,2")
    assert main(_simulate(tmp_path, trace, *extra)) == 2
    err = capsys.readouterr().err
    assert f"arena: error: field '{flag}': " in err and "Traceback" not in err, err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_run_out_near_the_bound_stops_at_the_clock_bound_and_says_so(tmp_path, capsys):
    """An arrival within the bound, whose run-out would pass it: the run ends at the last
    round before it, reported, with every job accounted for."""
    last = MAX_TIME_S - 5 * 300.0
    trace = _ours(tmp_path, f"j1,gpt__1.3B,32,100,{last!r},,1.0,default,a100,2",
                  f"j2,gpt__1.3B,32,100000000,{last!r},,1.0,default,a100,8")
    assert main(_simulate(tmp_path, trace, "--run-out")) == 0
    err = capsys.readouterr().err
    assert "reached the bound on simulated time after 5 rounds" in err and "1 job(s) unfinished" in err, err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["end_reason"] == "clock bound" and s["jobs_finished_runout"] == 1
    assert s["rounds_simulated"] == 5


def test_serve_refuses_a_round_interval_past_the_bound(tmp_path, capsys):
    assert main(["serve", "--local-slots", "2", "--round-interval", "1e20", "--db", str(tmp_path / "s.db"),
                 "--work-dir", str(tmp_path / "w")]) == 2
    assert f"field '--round-interval': {BOUND}, got 1e+20" in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("argv,field", [
    (["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--dry-run", "--stall-timeout", "1e300"],
     "--stall-timeout"),
    (["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--dry-run", "--timeout", "1e300"],
     "--timeout"),
    (["status", "--patience", "1e300", "--url", "http://127.0.0.1:9"], "--patience"),
])
def test_other_time_flags_are_bounded(tmp_path, capsys, monkeypatch, argv, field):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert f"field '{field}': {BOUND}, got 1e+300" in capsys.readouterr().err


def test_the_executor_raises_when_float_time_cannot_advance():
    """The loop guard: a completion that cannot move later in float time raises (was a
    spin). Reachable only past the bound, which every input is held to."""
    from engine.core.allocation import Allocation
    from engine.core.reconfig import ReconfigCostModel
    from engine.sim.sim_executor import SimExecutor
    from tests.test_engine_helpers import LinearOracle, grid, job
    ex = SimExecutor(LinearOracle(work_s=0.1), ReconfigCostModel(charge_launch=False), iteration_noise_cv=0)
    ex.launch(job("j", 0.0, 100), Allocation(grid("a100", 1, 1), ((0, 0),)), None, 1e19)
    with pytest.raises(RuntimeError, match="cannot move later in float time"):
        ex.advance(1e19 + 4096.0)


def test_outage_and_generator_times_are_bounded(tmp_path):
    from instances.cluster import ClusterSpec, NodeGroup
    from instances.generator import SyntheticJobsConfig
    from instances.outages import load_outages, synthetic_outages
    cluster = ClusterSpec((NodeGroup("a100", 2, 4),))
    p = tmp_path / "o.csv"
    for start, end, field in (("1e19", "", "start_s"), ("0", "1e300", "end_s")):
        p.write_text(f"node,start_s,end_s\n0,{start},{end}\n")
        with pytest.raises(InputError) as e:
            load_outages(p, cluster)
        assert (e.value.line, e.value.field) == (2, field) and BOUND in e.value.reason
    with pytest.raises(InputError, match="past the bound on durations") as e:
        synthetic_outages(cluster, mtbf_h=10**400, repair_h=1, start_s=0, hours=1)
    assert e.value.field == "mtbf_h"
    with pytest.raises(InputError) as e:
        SyntheticJobsConfig(mean_interarrival_s=1e300)
    assert e.value.field == "mean_interarrival_s" and BOUND in e.value.reason


def test_job_spec_times_and_priorities_are_bounded():
    from engine.service.jobspec import JobSpec
    good = {"name": "ok", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 10}
    for key, v in (("deadline_s", 1e19), ("deadline_s", 10**400), ("priority", 1e308), ("priority", 10**400),
                   ("priority", 1e-300), ("priority", float("nan"))):
        with pytest.raises(InputError) as e:
            JobSpec.from_dict({**good, key: v})
        assert e.value.field == key and e.value.file == "request", str(e.value)


# ------------------------------------------------------------------------------ sizes
def test_a_cluster_at_the_gpu_limit_builds_its_state_and_places_a_job():
    """One million one-GPU nodes (the documented limit, MAX_CLUSTER_GPUS): the engine's
    state and the placer are built (was quadratic: never finished) and place a job.
    Correctness only; bench/bench_cluster_build.py measures the scaling."""
    from engine.core.placement import Placer
    from engine.core.state import ClusterState
    from instances.cluster import MAX_CLUSTER_GPUS, ClusterSpec, NodeGroup
    from instances.grid import Grid, Shape
    spec = ClusterSpec((NodeGroup("a100", MAX_CLUSTER_GPUS - 4, 1), NodeGroup("v100", 1, 4)))
    st = ClusterState(spec)
    assert len(st.nodes) == MAX_CLUSTER_GPUS - 3 and spec.num_gpus == MAX_CLUSTER_GPUS
    assert st.nodes_by_type["a100-40gb"] == tuple(range(MAX_CLUSTER_GPUS - 4))
    assert st.nodes_by_type["v100-32gb"] == (MAX_CLUSTER_GPUS - 4,)
    assert st.used_by_type() == {"a100-40gb": 0, "v100-32gb": 0}
    res = Placer(spec).place({"j": Grid(Shape("a100-40gb", 4, 1), 1)}, {})
    assert not res.failed and len(res.allocations["j"].gpus) == 4
    st.assign("j", res.allocations["j"].gpus)
    assert st.used_by_type() == {"a100-40gb": 4, "v100-32gb": 0}
    assert spec.nodes() is spec.nodes()                     # built once per spec


def test_a_cluster_of_many_node_groups_loads_and_simulates(tmp_path, capsys):
    """200,000 one-node groups (never finished: the state's per-type node lists were built
    by tuple concatenation): loaded, state built, simulated."""
    n = 200_000
    c = tmp_path / "g.json"
    c.write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 1}] * n}))
    trace = _ours(tmp_path, "j1,gpt__1.3B,32,100,0,,1.0,default,a100,1")
    assert main(["simulate", "--cluster", str(c), "--trace", str(trace), "--rounds", "2", "--out",
                 str(tmp_path / "o"), "--quiet", "--no-plots"]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["jobs_finished"] == 1
    from instances.cluster import load_cluster
    spec = load_cluster(c)
    assert spec.node_id(n - 1) == n - 1 and len(spec.nodes()) == n and spec.gpus_by_type() == {"a100-40gb": n}


def test_hosts_are_looked_up_without_a_scan_per_name():
    from instances.cluster import ClusterSpec, NodeGroup
    n = 50_000
    spec = ClusterSpec((NodeGroup("cpu", n, 1, hosts=tuple(f"h{i}" for i in range(n))),))
    assert [spec.node_id(f"h{i}") for i in range(0, n, 7)] == list(range(0, n, 7))
    with pytest.raises(InputError, match="no node 'nope'"):
        spec.node_id("nope")


def test_gzip_bomb_is_refused_without_expanding_it(tmp_path):
    """A small .gz whose content passes MAX_INPUT_BYTES is refused as it streams (it was
    expanded whole: 1.9 MB to 2 GB took 13.7 GB)."""
    from instances.limits import MAX_INPUT_BYTES
    from instances.traces import load_trace
    p = tmp_path / "bomb.csv.gz"
    with gzip.open(p, "wb", compresslevel=1) as g:
        g.write(OURS.encode())
        zeros = b"0" * (1 << 20)
        for _ in range(MAX_INPUT_BYTES // len(zeros) + 1):
            g.write(zeros)
    assert p.stat().st_size < MAX_INPUT_BYTES // 100
    with pytest.raises(InputError, match="larger than 128 MiB once decompressed") as e:
        load_trace(p)
    assert e.value.file == str(p)


@pytest.mark.parametrize("data", [
    b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4,              # garbage after the magic bytes (zlib.error)
    gzip.compress(OURS.encode() * 50)[:-30],                   # truncated
    b"\x1f\x8b",                                               # the magic bytes alone
])
def test_corrupt_gzip_is_an_input_error_naming_the_file(tmp_path, data):
    from instances.outages import load_outages
    from instances.traces import load_trace
    p = tmp_path / "t.csv.gz"
    p.write_bytes(data)
    for load in (load_trace, lambda q: load_outages(q, None)):
        with pytest.raises(InputError, match="corrupt gzip data") as e:
            load(p)
        assert e.value.file == str(p)


# ------------------------------------------------------------------------------ nesting
DEEP = 30_000


def test_deep_json_and_toml_is_refused_by_every_reader(tmp_path):
    from engine.service.jobspec import JobSpec
    from instances.cluster import load_cluster
    from instances.hf_config import load_hf_config
    from launcher.config import TrainConfig
    deep_json = '{"model_type": ' + "[" * DEEP + "]" * DEEP + "}"
    for name, load in (("cluster.json", load_cluster), ("config.json", load_hf_config),
                       ("train.json", TrainConfig.read)):
        p = tmp_path / name
        p.write_text(deep_json)
        with pytest.raises(InputError, match="JSON nested too deeply") as e:
            load(p)
        assert e.value.file is not None and e.value.file.endswith(name)
    job = tmp_path / "job.toml"
    job.write_text("name = " + "[" * DEEP + "]" * DEEP + "\n")
    with pytest.raises(InputError, match="TOML nested too deeply") as e:
        JobSpec.from_toml(job)
    assert e.value.file == str(job)
    job.write_text('name = "x"\n' + ".".join(["a"] * DEEP) + " = 1\n")    # dotted keys nest without recursion
    with pytest.raises(InputError, match="TOML nested too deeply"):
        JobSpec.from_toml(job)


def test_just_deep_enough_is_taken_one_more_is_not():
    from instances.structured import loads_json, loads_toml
    ok = "[" * MAX_NESTING_DEPTH + "]" * MAX_NESTING_DEPTH
    assert loads_json(ok) is not None
    with pytest.raises(InputError, match="nested too deeply"):
        loads_json("[" + ok + "]")
    inner = ok[1:-1]                                            # the document's table is a level too
    assert loads_toml(f"a = {inner}\n")["a"] is not None
    with pytest.raises(InputError, match="nested too deeply"):
        loads_toml(f"a = {ok}\n")
    key = ".".join(["a"] * (MAX_NESTING_DEPTH - 1))
    assert loads_toml(f"{key} = 1\n") and loads_toml(f"[{key}]\nb = 2\n")
    for doc in (f"{key}.a.a = 1\n", f"x = 1\n[{key}.a]\n", f"t = {{ {key}.a = 1 }}\n"):
        with pytest.raises(InputError, match="nested too deeply"):
            loads_toml(doc)
    with pytest.raises(InputError, match="not usable JSON"):
        loads_json("9" * 5000)                                  # past Python's digit limit


@pytest.mark.parametrize("cmd", [["estimate", "--gpu-type", "a100", "--gpus", "4"],
                                 ["submit", "--name", "x", "--batch", "8", "--steps", "3"]])
def test_a_deep_config_json_is_a_clean_error_in_every_command(tmp_path, capsys, cmd):
    p = tmp_path / "config.json"
    p.write_text("[" * DEEP + "]" * DEEP)
    assert main([*cmd, "--model", str(p), *(["--url", "http://127.0.0.1:9"] if cmd[0] == "submit" else [])]) == 2
    err = capsys.readouterr().err
    assert "JSON nested too deeply" in err and "Traceback" not in err, err


def test_a_deep_request_body_is_a_400_not_a_500(tmp_path):
    from fastapi.testclient import TestClient

    from engine.service.api import ApiContext, create_app
    from engine.service.store import Store
    from instances.cluster import ClusterSpec, NodeGroup
    Store(tmp_path / "s.db").close()
    client = TestClient(create_app(ApiContext(str(tmp_path / "s.db"), str(tmp_path / "w"),
                                              ClusterSpec((NodeGroup("cpu", 1, 4),)), "fcfs")))
    body = ('{"name": "x", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 3, "tenant": '
            + "[" * 20_000 + "]" * 20_000 + "}")
    r = client.post("/api/jobs", content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["field"] == "body" and "nested too deeply" in r.json()["error"]


# ------------------------------------------------------------------------------ coefficients, threads
def test_a_priority_that_would_overflow_the_objective_is_refused_at_load(tmp_path, capsys):
    """Was a run ending mid-way with no results (objective coefficients must be finite)."""
    trace = _ours(tmp_path, "j1,gpt__1.3B,32,100,0,,1e308,default,a100,2")
    assert main(_simulate(tmp_path, trace, "--policy", "arena", "--rounds", "3")) == 2
    err = capsys.readouterr().err
    assert "line 3, field 'priority': job j1: must be a finite number in [0.0001, 10000]" in err, err


@pytest.mark.parametrize("opt,words", [
    ("w_jct=1e308", "field '--policy-opt': policy 'arena': weight must be a finite number in [0, 10000]"),
    ("jct.max_factor=1e300", "must be a finite number in [-10000, 10000]"),
    ("threads=99999", "threads must be at most the"),
    ("time_limit_s=1e300", "time_limit_s must be a finite number in [0.01, 9e+12]"),
    ("seed=99999999999", "seed must be a finite number in [0, 2147483647]"),
    ("payback_max_s=1e300", BOUND),
    ("change_budget_per_job=1e300", "change_budget_per_job must be at most 10000"),
])
def test_policy_options_past_their_range_are_refused_before_the_run(tmp_path, capsys, opt, words):
    assert main(["simulate", "--instance", "demo", "--policy", "arena", "--policy-opt", opt, "--rounds", "2",
                 "--out", str(tmp_path / "o"), "--quiet", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


def test_every_solver_backend_is_held_to_the_cores_present():
    """Every backend (HiGHS, CP-SAT, SCIP, CBC, the Lagrangian and greedy paths) takes its
    threads from SolverOptions, which refuses more than the cores present (99,999 aborted
    HiGHS after a minute and 800 MB)."""
    from engine.decide.solvers.base import SolverOptions, available_cores, backend_names, make_backend
    cores = available_cores()
    assert cores == len(os.sched_getaffinity(0))
    for name in backend_names():
        assert make_backend(name, SolverOptions(threads=cores)).options.threads == cores
    for bad in (cores + 1, 99_999, 0, True, 1.5):
        with pytest.raises(InputError) as e:
            SolverOptions(threads=bad)
        assert e.value.field == "threads"


def test_bench_solver_threads_and_time_limit_are_bounded(capsys):
    assert main(["bench", "solver", "--gpus", "8", "--jobs", "4", "--threads", "99999"]) == 2
    assert "field '--threads': must be at most the" in capsys.readouterr().err
    assert main(["bench", "solver", "--gpus", "8", "--jobs", "4", "--time-limit", "1e300"]) == 2
    assert f"field '--time-limit': {BOUND}" in capsys.readouterr().err


# ------------------------------------------------------------------------------ Ctrl-C
def _interrupt(cmd: list[str], wait_for: str, tmp_path: Path) -> tuple[int, str]:
    """Run ``arena CMD``, send SIGINT once ``wait_for`` appears on its stderr, return
    (exit status, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "engine.cli", *cmd], cwd=tmp_path, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines, deadline = [], time.monotonic() + 120
    try:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line)
            if wait_for in line:
                p.send_signal(signal.SIGINT)
                break
            assert time.monotonic() < deadline, "".join(lines)
        _, rest = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, "".join(lines) + rest


def test_ctrl_c_during_a_simulation_writes_the_results_so_far(tmp_path):
    out = tmp_path / "o"
    rc, err = _interrupt(["simulate", "--instance", "arena-philly", "--policy", "fcfs", "--run-out",
                          "--no-plots", "--out", str(out)], "round ", tmp_path)
    assert rc == 130, err
    assert "interrupted: stopping before the next round" in err and "Traceback" not in err, err
    assert "interrupted (Ctrl-C) after" in err and f"the results so far are in {out}/" in err, err
    s = json.loads((out / "summary.json").read_text())
    assert s["end_reason"] == "interrupted" and s["interrupted"] is True
    assert 0 < s["rounds_simulated"] < 86_000
    rounds = (out / "rounds.csv").read_text().splitlines()
    assert len(rounds) == s["rounds_simulated"] + 1
    assert len((out / "jobs.csv").read_text().splitlines()) == s["jobs_total"] + 1


def test_ctrl_c_during_bench_policies_writes_the_rows_so_far(tmp_path):
    out = tmp_path / "b"
    rc, err = _interrupt(["bench", "policies", "--instance", "arena-philly", "--policy", "fcfs",
                          "--policy", "gavel", "--out", str(out)], "[fcfs] round", tmp_path)
    assert rc == 130, err
    assert "arena bench policies: interrupted (Ctrl-C): 0 of 2 policies ran to their end" in err, err
    doc = json.loads((out / "results.json").read_text())
    assert doc["interrupted"] is True and [r["policy"] for r in doc["rows"]] == ["fcfs"]
    assert doc["rows"][0]["end_reason"] == "interrupted"
    assert (out / "fcfs" / "summary.json").exists()
