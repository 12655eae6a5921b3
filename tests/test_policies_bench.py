"""`arena bench policies`: side-by-side rows, outputs, and the same rows under MPI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.main import main

ARGS = ["bench", "policies", "--instance", "demo", "--policy", "fcfs", "--policy", "elasticflow-ls",
        "--rounds", "15", "--no-run-out", "--quiet", "--json"]


def test_policy_bench_writes_rows_table_and_figure(tmp_path, capsys):
    assert main(ARGS + ["--out", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["fcfs", "elasticflow-ls"]
    for r in rows:
        assert r["jobs_finished"] >= 0 and r["packing_failures"] == 0
        assert r["avg_jct_over_bound"] is None                 # not run out: no average over all jobs
    assert (tmp_path / "comparison.png").stat().st_size > 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [r["policy"] for r in saved["rows"]] == ["fcfs", "elasticflow-ls"]


def test_policy_bench_rejects_options_for_absent_policies():
    from engine.cli.commands.bench.policies import policy_options
    from instances.errors import InputError
    with pytest.raises(InputError):
        policy_options(["arena:w_jct=2"], ["fcfs"])
    # values are parsed as arena simulate's are (a policy that checks a bool gets a bool)
    assert policy_options(["arena:w_jct=2", "arena:stability=false"], ["arena"]) == \
        {"arena": {"w_jct": 2, "stability": False}}


def test_policy_bench_parses_option_values_and_names_a_bad_one(capsys):
    base = ["bench", "policies", "--instance", "demo", "--policy", "fcfs", "--rounds", "3", "--no-run-out",
            "--quiet", "--json"]
    assert main(base + ["--policy-opt", "fcfs:backfill=true"]) == 0        # was a ValueError traceback
    assert json.loads(capsys.readouterr().out)[0]["options"] == {"backfill": True}
    assert main(base + ["--policy-opt", "fcfs:backfill=maybe"]) == 2
    assert "backfill must be a bool" in capsys.readouterr().err


def test_policy_bench_runs_labelled_variants_beside_the_default(tmp_path, capsys):
    # the research use: one objective's variant beside the policy's default, same workload
    args = ["bench", "policies", "--instance", "demo", "--policy", "arena", "--policy", "arena-ms=arena",
            "--policy-opt", "arena-ms:w_makespan=10", "--rounds", "15", "--quiet", "--json", "--out", str(tmp_path)]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["policy_name"]) for r in rows] == [("arena", "arena"), ("arena-ms", "arena")]
    assert rows[0]["options"] == {} and rows[1]["options"] == {"w_makespan": 10}
    assert (tmp_path / "arena-ms" / "summary.json").exists() and (tmp_path / "arena" / "summary.json").exists()
    assert "arena-ms,arena," in (tmp_path / "results.csv").read_text()          # the CSV says what a label ran
    # the option reached the variant's policy: its objective differs, so do its decisions
    a, b = (json.loads((tmp_path / p / "summary.json").read_text()) for p in ("arena", "arena-ms"))
    assert (a["avg_jct_runout_s"], a["makespan_runout_s"]) != (b["avg_jct_runout_s"], b["makespan_runout_s"])
    # run out, every row is also judged against every job alone at its fastest shape
    for r in rows:
        assert r["avg_jct_bound_s"] > 0 and r["jobs_unfinished_runout"] == 0
        assert r["avg_jct_over_bound"] == pytest.approx(r["avg_jct_runout_s"] / r["avg_jct_bound_s"])
        assert r["avg_jct_over_bound"] >= 1.0


@pytest.mark.parametrize("policies, message", [
    (["arena", "arena"], "given twice"),
    (["x=arena", "x=sia"], "given twice"),
    (["a/b=arena"], "LABEL=NAME"),
    (["ms=nope"], "nope"),
])
def test_policy_bench_checks_labels_before_running(policies, message, capsys):
    args = ["bench", "policies", "--instance", "demo", "--quiet", "--json"]
    for p in policies:
        args += ["--policy", p]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_policy_bench_over_mpi_gives_the_same_rows(tmp_path, capsys):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec in the virtualenv")
    assert main(ARGS) == 0
    single = json.loads(capsys.readouterr().out)
    cmd = [str(mpiexec), "-n", "2", sys.executable, "-m", "engine.cli"] + ARGS
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr[-2000:]
    start = out.stdout.index("[")
    multi = json.loads(out.stdout[start:])
    keys = ("policy", "jobs_finished", "avg_jct_s", "avg_throughput", "reconfigurations", "reconfigurations_per_job")
    assert [{k: r[k] for k in keys} for r in multi] == [{k: r[k] for k in keys} for r in single]


def test_policy_bench_on_the_users_cluster_and_trace_with_realistic_moves(tmp_path, capsys):
    from instances.traces import write_trace
    from tests.test_engine_helpers import job
    (tmp_path / "c.json").write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 2,
                                                                  "gpus_per_node": 8}]}))
    write_trace([job(f"J{i}", 200.0 * i, 400, gpus=4) for i in range(6)], tmp_path / "t.csv")
    args = ["bench", "policies", "--cluster", str(tmp_path / "c.json"), "--trace", str(tmp_path / "t.csv"),
            "--policy", "arena", "--policy", "sia-ap", "--policy", "fcfs", "--reconfig-opt", "preset=realistic",
            "--quiet", "--json", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["arena", "sia-ap", "fcfs"]
    for r in rows:
        assert r["move_costs"] == "realistic" and r["jobs_never_placed"] == 0
        assert r["reconfigurations_per_job_runout"] is not None and r["reconfig_gpu_hours_lost_runout"] >= 0
    assert rows[0]["perf"] in ("analytic", "learned")          # estimates, not the table, by default
    assert (tmp_path / "o" / "comparison.png").stat().st_size > 0


@pytest.mark.parametrize("extra, field", [
    (["--reconfig-opt", "preset=nope"], "--reconfig-opt"),
    (["--reconfig-opt", "restart_s=-1"], "--reconfig-opt"),
    (["--perf", "oracle"], "kind"),
    (["--cluster", "/nonexistent/c.json", "--trace", "/nonexistent/t.csv"], None),
    (["--trace", "/nonexistent/t.csv"], "--cluster"),
])
def test_policy_bench_checks_inputs_before_running(extra, field, capsys):
    args = ["bench", "policies", "--policy", "fcfs", "--quiet", "--json"] + extra
    if "--cluster" not in extra and "--trace" not in extra:
        args += ["--instance", "demo"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error" in err.lower()
    if field:
        assert field in err


def test_policy_bench_over_slurm_tasks_gives_the_same_rows(slurm_cluster, tmp_path, capsys):
    """``srun -n 2 arena bench policies --seeds 0,1`` (Slurm starts no MPI here:
    ``MpiDefault=none``): the tasks split the policies of each seed and task 0 prints the
    one-process rows, once (engine/cli/commands/bench/spread.py)."""
    args = [a if a != "15" else "5" for a in ARGS] + ["--seeds", "0,1"]
    assert main(args) == 0
    single = json.loads(capsys.readouterr().out)["rows"]
    out = slurm_cluster.run("srun", "-n", "2", "--kill-on-bad-exit=1", f"--chdir={tmp_path}", sys.executable,
                            "-m", "engine.cli", *args, check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    multi = json.loads(out.stdout)["rows"]                  # one JSON document: task 1 prints nothing
    keys = ("seed", "policy", "jobs_finished", "avg_jct_s", "avg_throughput", "reconfigurations")
    assert [{k: r[k] for k in keys} for r in multi] == [{k: r[k] for k in keys} for r in single]
    assert len(single) == 4
    assert not (tmp_path / ".arena-tasks").exists()          # the tasks' gathering folder removed


def test_slurm_tasks_gather_in_rank_order_and_name_a_task_that_failed(tmp_path, monkeypatch):
    from engine.cli.commands.bench.spread import SlurmTasks, TaskFailed, comm
    env = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}
    monkeypatch.chdir(tmp_path)
    one = comm(env)
    assert isinstance(one, SlurmTasks) and (one.Get_rank(), one.Get_size()) == (1, 2)
    assert comm({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}) is None        # a batch script, not a step
    zero = SlurmTasks(0, 2, one.folder)
    assert one.gather({"r": 1}) is None
    assert zero.gather({"r": 0}) == [{"r": 0}, {"r": 1}]
    one.at_exit()                                                           # task 1 exits before its next rows
    with pytest.raises(TaskFailed, match="Slurm task 1 of 2 ended without its rows"):
        zero.gather({"r": 0})
    one.finish()
    zero.finish()
    assert not (tmp_path / ".arena-tasks").exists()
