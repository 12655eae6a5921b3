"""CLI smoke tests: `arena simulate` on demo writes every file; `arena instances` lists."""
from __future__ import annotations

import json

import pytest

from engine.cli.main import main
from engine.sim.plots import PLOT_FILES


def test_simulate_demo_writes_all_files(tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["simulate", "--instance", "demo", "--rounds", "40", "--run-out", "--out", str(out), "--quiet",
               "--policy-opt", "backfill=true"])
    assert rc == 0
    for f in ("summary.json", "jobs.csv", "rounds.csv", "moves.csv") + PLOT_FILES:
        assert (out / f).stat().st_size > 0, f
    s = json.loads((out / "summary.json").read_text())
    for k in ("jobs_total", "jobs_finished", "jobs_never_placed", "avg_jct_s", "median_jct_s", "p95_jct_s",
              "p99_jct_s", "makespan_s", "avg_throughput", "peak_throughput", "reconfigurations",
              "reconfig_gpu_hours_lost", "decision_time_median_s", "decision_time_p99_s", "packing_failures",
              "avg_queueing_delay_s", "avg_jct_runout_s", "makespan_runout_s"):
        assert k in s, k
    assert s["jobs_total"] == 40 and s["jobs_finished_runout"] + s["jobs_unfinished_runout"] == 40
    jobs_csv = (out / "jobs.csv").read_text().splitlines()
    assert len(jobs_csv) == 41
    assert "avg_jct_s" in capsys.readouterr().out


def test_simulate_bad_options_are_input_errors(tmp_path, capsys):
    assert main(["simulate", "--instance", "demo", "--policy-opt", "nope=1", "--out", str(tmp_path)]) == 2
    assert "--policy-opt" in capsys.readouterr().err
    assert main(["simulate", "--instance", "demo", "--dump-rounds", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "--dump-rounds" in capsys.readouterr().err
    assert main(["simulate", "--instance", "no-such-instance"]) == 2
    assert main(["simulate", "--cluster", "x.json"]) == 2
    assert main(["simulate", "--instance", "demo", "--policy-opt", "novalue"]) == 2


@pytest.mark.parametrize("args", [
    ["simulate", "--instance", "demo", "--policy", "sia-ap", "--policy-opt", "bogus=1"],
    ["simulate", "--instance", "demo", "--policy", "fcfs", "--policy-opt", "bogus=1"],
    ["bench", "policies", "--instance", "demo", "--policy", "sia-ap", "--policy-opt", "sia-ap:bogus=1"],
    ["serve", "--local-slots", "2", "--policy", "sia-ap", "--policy-opt", "bogus=1"],
])
def test_an_unknown_policy_option_names_the_flag_the_policy_and_the_key_once(args, tmp_path, capsys):
    out = ["--db", str(tmp_path / "s.db"), "--work-dir", str(tmp_path / "w")] if args[0] == "serve" \
        else [] if args[0] == "bench" else ["--out", str(tmp_path / "o")]
    assert main(args + out) == 2
    err = capsys.readouterr().err
    name = args[args.index("--policy") + 1]
    assert f"field '--policy-opt': policy '{name}': unknown option(s) ['bogus']" in err, err
    assert err.count(f"'{name}'") == 1, err


def test_simulate_cluster_and_trace_files(tmp_path):
    from instances.traces import write_trace
    from tests.test_engine_helpers import job
    (tmp_path / "c.json").write_text(json.dumps({"node_groups": [{"gpu_type": "a100", "num_nodes": 2,
                                                                  "gpus_per_node": 4}]}))
    write_trace([job("A", 0.0, 50, gpus=4), job("B", 100.0, 50, gpus=8)], tmp_path / "t.csv")
    out = tmp_path / "o"
    assert main(["simulate", "--cluster", str(tmp_path / "c.json"), "--trace", str(tmp_path / "t.csv"),
                 "--out", str(out), "--quiet", "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["jobs_total"] == 2 and s["jobs_finished"] == 2


def test_instances_lists_builtins(capsys):
    assert main(["instances"]) == 0
    out = capsys.readouterr().out
    assert "arena-philly" in out and "1,938" in out and "demo" in out


def test_parse_value():
    from engine.cli.common import parse_value
    assert parse_value("3") == 3 and parse_value("2.5") == 2.5 and parse_value("False") is False
    assert parse_value("cbc") == "cbc" and parse_value("none") is None


def _cluster_trace(tmp_path, rows: str) -> list[str]:
    (tmp_path / "c.json").write_text('[{"a100": {"node_num": 2}}]')
    (tmp_path / "t.csv").write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,"
                                    "num_gpu,gpu_type\n" + rows)
    return ["--cluster", str(tmp_path / "c.json"), "--trace", str(tmp_path / "t.csv")]


def test_output_paths_are_checked_before_the_run(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for flag in ("--out", "--dump-rounds"):
        assert main(["simulate", "--instance", "demo", flag, str(a_file)]) == 2
        err = capsys.readouterr()
        assert f"field '{flag}'" in err.err and "not a directory" in err.err
        assert err.out == ""                    # refused before any simulation or summary
    assert main(["simulate", "--instance", "demo", "--out", str(a_file / "sub")]) == 2
    assert "cannot be created" in capsys.readouterr().err
    assert main(["bench", "policies", "--policy", "fcfs", "--out", str(a_file)]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("iters", ["1e30", "99999999999"])
def test_absurd_iteration_counts_are_refused(tmp_path, capsys, iters):
    args = _cluster_trace(tmp_path, f"1,0,{iters},gpt__1.3B,100000,32,2,a100\n")
    assert main(["simulate", *args, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "field 'num_iteration': must be <= 1e+09" in capsys.readouterr().err


def test_never_placed_job_is_named_on_stderr(tmp_path, capsys):
    args = _cluster_trace(tmp_path, "1,0,100,gpt__1.3B,100000,32,2,a100\n2,0,100,gpt__1.3B,100000,32,2,v100\n")
    assert main(["simulate", *args, "--out", str(tmp_path / "o"), "--quiet", "--no-plots"]) == 0
    cap = capsys.readouterr()
    assert "1 job(s) never placed under fcfs (gpu type missing: 1)" in cap.err
    assert "job 2 (gpt__1.3B, batch 32): requests GPU type v100-32gb, which the cluster lacks" in cap.err
    assert "never_placed_reasons" in cap.out and "gpu type missing: 1" in cap.out
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["jobs_never_placed"] == 1 and s["never_placed_reasons"] == "gpu type missing: 1"


@pytest.mark.parametrize("policy", ["arena", "fcfs"])
def test_a_job_never_chosen_is_explained_for_the_policy_that_ran(tmp_path, capsys, policy):
    # six one-GPU jobs on one node of 4 GPUs, for 3 rounds: some never start
    rows = "".join(f"{i},0,1000000,gpt__1.3B,100000000,32,1,a100\n" for i in range(1, 7))
    args = _cluster_trace(tmp_path, rows)
    (tmp_path / "c.json").write_text('[{"a100": {"node_num": 1}}]')
    assert main(["simulate", *args, "--policy", policy, "--rounds", "3", "--out", str(tmp_path / "o"), "--quiet",
                 "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert f"never placed under {policy} (never chosen:" in err
    if policy == "fcfs":
        assert "fcfs never chose a grid for it (no node layout of the cluster holds its request" in err
    else:           # the fcfs hint is for fcfs only
        assert "arena never chose a grid for it (it waited for room until the end" in err and "fcfs" not in err


def test_run_out_safety_limit_is_reported(tmp_path, capsys):
    args = _cluster_trace(tmp_path, "1,0,1000000,gpt__1.3B,1e9,32,2,a100\n")
    assert main(["simulate", *args, "--out", str(tmp_path / "o"), "--quiet", "--no-plots",
                 "--max-rounds", "30"]) == 0
    err = capsys.readouterr().err
    assert "reached the safety limit of 30 rounds" in err and "1 job(s) unfinished" in err


def test_help_describes_the_tool_and_every_command_and_flag():
    import argparse

    from engine.cli.main import build_parser
    parser = build_parser()
    assert parser.description.startswith("arena: schedule large-model training jobs")
    missing = []

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    if not sub.description:
                        missing.append(" ".join(path + [name]) + ": no description")
                    walk(sub, path + [name])
            elif not a.help and a.dest != "help":
                missing.append(" ".join(path) + f" {a.option_strings or a.dest}: no help")
    walk(parser, ["arena"])
    assert not missing, missing


def test_models_lists_the_catalog_with_sizes(capsys):
    from instances.models import MODELS
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(MODELS)
    gpt = next(r for r in rows if r["name"] == "gpt__1.3B")
    assert 1.2e9 < gpt["parameters"] < 1.4e9 and gpt["layers"] == 24
    assert main(["models"]) == 0
    assert "gpt__1.3B" in capsys.readouterr().out


def test_other_output_paths_fail_before_work(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["estimate", "accuracy", "--plot", str(a_file)]) == 2
    assert "field '--plot': exists and is not a directory" in capsys.readouterr().err
    assert main(["profile", "--model", "tiny-gpt__2L", "--store", str(a_file)]) == 2
    assert "field '--store': exists and is not a directory" in capsys.readouterr().err
    assert main(["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--timeout", "0",
                 "--run-dir", str(tmp_path / "run")]) == 2
    assert "field '--timeout'" in capsys.readouterr().err
    assert main(["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--global-batch", "0",
                 "--run-dir", str(tmp_path / "run")]) == 2
    assert "field '--global-batch'" in capsys.readouterr().err


def test_proxy_quality_prints_both_figures_with_their_meaning(capsys):
    assert main(["estimate", "proxy-quality", "--model", "moe__690M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grids"] > 0 and 0 < out["mean_fraction_of_best_known"] <= 1.0
    assert out["mean_fraction_of_best_known"] <= out["mean_fraction_of_best"] + 1e-12
    assert main(["estimate", "proxy-quality", "--model", "moe__690M"]) == 0
    text = capsys.readouterr().out
    assert "mean proxy / exhaustive-search throughput" in text and "mean proxy / best known plan" in text


def test_accuracy_progress_goes_to_stderr_and_json_stays_pure(monkeypatch, capsys):
    """The CLI layer's wiring only (the real comparison takes about a minute): each phase the
    comparison announces through ``progress`` is a stderr line; stdout is one JSON document."""
    import estimators.evaluation.accuracy as acc

    def fake_against_arena(*, seed, few_shot, progress):
        progress("phase one")
        progress("phase two")
        return {"overall": {}}
    monkeypatch.setattr(acc, "against_arena", fake_against_arena)
    monkeypatch.setattr(acc, "dp_memory_check", lambda: {})
    assert main(["estimate", "accuracy", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == {"overall": {}, "dp_memory": {}}
    lines = [line.split("]: ", 1)[1] for line in cap.err.splitlines()]
    assert lines[1:3] == ["phase one ...", "phase two ..."] and lines[-1] == "done"


def test_json_and_quiet_runs_print_no_solver_banner():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "engine.cli", "bench", "incremental", "--gpus", "32", "--jobs", "8",
                        "--rounds", "1", "--backend", "highs", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)                              # pure JSON on stdout
    assert "HiGHS" not in r.stderr and "Copyright" not in r.stderr


def test_a_reader_that_goes_away_is_no_traceback():
    # `arena models --json | head -c 1`: stdout's reader is gone before the command writes
    import subprocess
    import sys
    code = ("import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
            "from engine.cli.main import main; sys.exit(main(['models', '--json']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def strict_json(text: str):
    def refuse(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_without_nan_or_infinity(tmp_path, capsys):
    import math

    import numpy as np

    from engine.cli.jsonout import dumps
    assert strict_json(dumps({"a": math.nan, "b": [math.inf, 1.5, np.float32("nan"), np.float64(2.0)],
                              "c": (np.int64(3),)})) == {"a": None, "b": [None, 1.5, None, 2.0], "c": [3]}
    # the greedy backend proves no gap (infinite); fcfs over 3 rounds finishes no job (mean JCT over none)
    assert main(["bench", "solver", "--gpus", "64", "--jobs", "10", "--repeat", "1", "--json"]) == 0
    assert any(r.get("max_gap") is None for r in strict_json(capsys.readouterr().out))
    assert main(["bench", "policies", "--instance", "demo", "--rounds", "3", "--no-run-out", "--policy", "fcfs",
                 "--json", "--quiet", "--out", str(tmp_path / "b")]) == 0
    rows = strict_json(capsys.readouterr().out)
    assert rows[0]["avg_jct_s"] is None
    strict_json((tmp_path / "b" / "results.json").read_text())


BAD_OPTIONS = [   # (arguments, what the error must say): every one refused before any work, no traceback
    (["simulate", "--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    (["bench", "policies", "--instance", "demo", "--seed", "-1"], "argument --seed"),
    (["outages", "--instance", "demo", "--mtbf-hours", "1", "--repair-hours", "1", "--hours", "1", "--seed", "-2",
      "--out", "{tmp}/o.csv"], "argument --seed"),
    (["estimate", "accuracy", "--against", "arena-measured", "--refit-analytic", "--refit-evals", "-1"],
     "field '--refit-evals': must be in 1..10,000, got -1"),
    (["estimate", "fit", "--out", "{tmp}"], "field '--out': is a folder"),
    (["estimate", "proxy-quality", "--model", "gpt__1.3B", "--batch", "0"], "field '--batch': must be in 1..1,048,576"),
    (["estimate", "--model", "gpt__1.3B", "--gpu-type", "a100", "--gpus", "8", "--batch", str(10**20)],
     "field '--batch': must be in 1..1,048,576 samples"),
    (["estimate", "--model", "gpt__1.3B", "--gpu-type", "a100", "--gpus", "8", "--passes", "2"],
     "field '--passes': the grids action does not read it (it is for accuracy --against local)"),
    (["estimate", "fit", "--gpus", "8"], "field '--gpus': the fit action does not read it (it is for grids)"),
    (["estimate", "--model", "nosuch", "--gpu-type", "a100", "--gpus", "8"], "field '--model': unknown model"),
    (["estimate", "--model", "gpt__1.3B", "--gpu-type", "zz", "--gpus", "8"], "field '--gpu-type': unknown GPU type"),
    (["estimate", "--model", "gpt__1.3B", "--gpu-type", "a100", "--gpus", "8", "--perf", "zz"],
     "field '--perf': unknown performance model kind"),
    (["estimate", "--model", "gpt__1.3B", "--gpu-type", "a100", "--gpus", "8", "--link-load", "-1"],
     "field '--link-load': must be a fraction of the links' capacity in [0, 1]"),
    (["estimate", "accuracy", "--against", "local", "--passes", "0"], "field '--passes': must be in 1..1,000, got 0"),
    (["estimate", "proxy-quality", "--model", "nosuch"], "field '--model': unknown model"),
    (["bench", "solver", "--gpus", "64", "--jobs", "10", "--backend", "nosuch"],
     "field '--backend': unknown solver backend 'nosuch'"),
    (["bench", "incremental", "--backend", "nosuch"], "field '--backend': unknown solver backend 'nosuch'"),
    (["bench", "policies", "--instance", "demo", "--perf", "nosuch"], "field '--perf': unknown performance model"),
    (["simulate", "--rounds", str(10**13)],
     "field '--rounds': the horizon of 10,000,000,000,000 rounds exceeds the safety limit of 1,000,000 rounds"),
    (["bench", "policies", "--instance", "demo", "--rounds", str(10**13)],
     "field '--rounds': the horizon of 10,000,000,000,000 rounds exceeds the safety limit of 1,000,000"),
    (["simulate", "--round-interval", "inf"], "field '--round-interval': must be <= 9e12 s"),
    (["simulate", "--round-interval", "1e200"], "field '--round-interval'"),
    (["simulate", "--outages", ""], "field '--outages': is empty"),
    (["simulate", "--instance", ""], "field '--instance': is empty"),
    (["bench", "bound", "--trace", ""], "field '--trace': is empty"),
    (["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--dry-run", "--hostfile", "{tmp}/afile/x"],
     "{tmp}/afile/x: hostfile not found"),
    (["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--dry-run", "--hostfile", "{tmp}"],
     "is a folder, not a hostfile"),
    (["serve", "--local-slots", str(10**13), "--db", "{tmp}/s.db", "--work-dir", "{tmp}/w"],
     "field '--local-slots': 1 nodes of 10,000,000,000,000 slots are more than the 1,048,576"),
    (["simulate", "--policy", "arena", "--policy-opt", "time_limit_s=5", "--policy-opt", "time_limit_s=10"],
     "field '--policy-opt': time_limit_s given twice (5 and 10); give it once"),
    (["bench", "policies", "--instance", "demo", "--policy", "fcfs", "--policy-opt", "fcfs:backfill=true",
      "--policy-opt", "fcfs:backfill=false"], "field '--policy-opt': fcfs:backfill given twice"),
    (["bench", "solver", "--objective", "jct=1,jct=2"], "field '--objective': term 'jct' given twice"),
    (["bench", "incremental", "--queued", "nosuch"], "field '--queued': must be one of all, small, got 'nosuch'"),
    (["simulate", "--reconfig-opt", "restart_s=-1"], "field '--reconfig-opt': restart_s must be a finite number"),
    # arena profile: each refused by its flag before a launch is timed (internal names, tracebacks, or a
    # tensor degree no model takes measured nothing and exited 0)
    (["profile", "--model", "nosuch", "--store", "{tmp}/st"], "field '--model': unknown model"),
    (["profile", "--model", "tiny-gpt__2L", "--store", "{tmp}/st", "--tp", "3"],
     "field '--tp': tensor degree 3 divides the attention heads of no model given"),
    (["profile", "--model", "tiny-gpt__2L", "--store", "{tmp}/st", "--micro-batches", "0"], "field '--micro-batches'"),
    (["profile", "--model", "tiny-gpt__2L", "--store", "{tmp}/st", "--max-gpus", "0"], "field '--max-gpus'"),
    (["profile", "--model", "tiny-gpt__2L", "--store", "{tmp}/st", "--run-grids", "-1"], "field '--run-grids'"),
    (["profile", "--model", "tiny-gpt__2L", "--store", "{tmp}/st", "--warmup-iters", "-1"], "field '--warmup-iters'"),
    (["profile", "--model", "tiny-gpt__2L", "--store", "{tmp}/st", "--group-sizes", "1"],
     "field '--group-sizes': a collective needs a group of at least 2 processes"),
    (["estimate", "--model", "gpt__1.3B", "--gpu-type", "a100", "--gpus", "8", "--gpus-per-node", "0"],
     "field '--gpus-per-node'"),
    (["bench", "solver", "--gpus", "64", "--jobs", "-1"], "field '--jobs'"),
    (["bench", "solver", "--gpus", "64", "--jobs", "10", "--repeat", "0"], "field '--repeat'"),
    (["bench", "solver", "--gpus", "100000000", "--jobs", "10"], "field '--gpus': must be in 8..1,048,576"),
    (["bench", "incremental", "--jobs", "100000000"], "field '--jobs'"),
    (["bench", "solver", "--gpus", "64", "--jobs", "10", "--time-limit", "0"], "field '--time-limit'"),
    (["bench", "incremental", "--rel-gap", "nan"], "field '--rel-gap'"),
    (["bench", "incremental", "--objective", "jct=-1"], "field '--objective'"),
    (["bench", "incremental", "--move-cost-cap", "-1"], "field '--move-cost-cap'"),
    (["simulate", "--perf", "nosuch", "--policy", "arena"], "field '--perf': unknown performance model kind"),
    (["simulate", "--instance", "nosuch"], "field '--instance': unknown instance 'nosuch'"),
    (["serve", "--local-slots", "2", "--policy", "nosuch", "--db", "{tmp}/s.db", "--work-dir", "{tmp}/w"],
     "field '--policy': unknown policy 'nosuch'"),
    (["simulate", "--reconfig-opt", "nokv"], "arena: error: field '--reconfig-opt': expected KEY=VALUE"),
    (["simulate", "--policy", "arena", "--profile-store", "{tmp}/afile"], "field '--profile-store': is a file"),
    (["simulate", "--policy", "arena", "--policy-opt", "threads=1.5"], "threads must be a whole number"),
    (["simulate", "--policy", "arena", "--policy-opt", "rel_gap=5"], "rel_gap must be a finite number in"),
    (["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--num-nodes", "0", "--dry-run"],
     "field '--num-nodes'"),
    (["simulate", "--out", ""], "field '--out': is empty"),
    (["--plugin", "os.path", "models"], "registered nothing"),
    (["submit", "--name", "a", "--model", "tiny-gpt__2L", "--batch", "0", "--steps", "3"], "field '--batch'"),
]


@pytest.mark.parametrize("args, says", BAD_OPTIONS, ids=[" ".join(a[:3]) + " " + a[-1] for a, _ in BAD_OPTIONS])
def test_a_bad_option_is_refused_first_by_its_own_flag(args, says, tmp_path, capsys):
    import time
    (tmp_path / "afile").write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    t0 = time.perf_counter()
    try:
        rc = main(args)
    except SystemExit as e:                 # argparse's own refusal
        rc = e.code
    err = capsys.readouterr().err
    says = says.replace("{tmp}", str(tmp_path))
    assert rc == 2 and says in err and "Traceback" not in err, err
    assert "ReconfigCostModel" not in err                   # (a class's name is no option the user typed)
    assert time.perf_counter() - t0 < 30, "refused only after work"
