"""Issue 58's flags, files and clients (D1-D11, F1-F7, and the same classes found beyond
them): each value that was taken without a word, printed ``nan``/``inf`` as a result, or
ended in a traceback is now refused by its flag (or named file and field), with exit
status 2, before any work; or, where it is a documented fallback, taken and said.

Every case runs in-process and is refused before a rank, a profile or a round starts
(the slowest, ``profile``'s, import torch to count the host's cores)."""
from __future__ import annotations

import csv
import json
import math
import os
import sqlite3
from pathlib import Path

import pytest

from engine.cli.main import main
from instances.errors import InputError

BOUND = "must be <= 9e12 s (about 285,000 years"


def refused(argv: list[str], capsys, *says: str) -> str:
    """``arena ARGV`` exits 2 with one error line holding every one of ``says``."""
    try:
        rc = main(argv)
    except SystemExit as e:             # argparse's own refusal
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("arena")]
    assert lines and all(s in lines[-1] for s in says), err
    return lines[-1]


def _simulate(tmp_path, *extra: str) -> list[str]:
    return ["simulate", "--instance", "demo", "--rounds", "3", "--no-plots", "--quiet",
            "--out", str(tmp_path / "o"), *extra]


# ------------------------------------------------------------------------ simulate, output paths
def test_a_round_interval_of_1e_300_runs_without_overflow(tmp_path, capsys):
    """D1: floor(9e12 / 1e-300) overflowed; the rounds are simulated (3 of 1e-300 s: no job
    ends, which the summary says) or, where float time cannot tell the rounds apart, refused."""
    assert main(_simulate(tmp_path, "--round-interval", "1e-300")) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["rounds_simulated"] == 3 and s["jobs_finished"] == 0
    refused(_simulate(tmp_path, "--round-interval", "5e-324", "--run-out"), capsys,
            "field '--round-interval': a round interval of 4.94066e-324 s is below what float time resolves")


@pytest.mark.parametrize("out", ["d/" + "x" * 300, "x" * 300, "d/" + "x" * 300 + "/y"])
def test_an_output_name_too_long_is_refused_before_the_run_and_makes_nothing(tmp_path, capsys, monkeypatch, out):
    """D2: the check passed a missing folder below which the name was too long; the writer
    failed after the run, having made ``d``."""
    monkeypatch.chdir(tmp_path)
    # (a name the OS itself refuses to look up: "cannot be used: File name too long")
    says = "is 300 bytes long, more than the 255" if out.startswith("d/") else "File name too long"
    refused(_simulate(tmp_path)[:-1] + [out], capsys, "field '--out': cannot be", says)
    assert not list(tmp_path.iterdir())
    refused(["outages", "--mtbf-hours", "9", "--repair-hours", "1", "--hours", "9", "--out", out + ".csv"], capsys,
            "field '--out': cannot be")
    assert not list(tmp_path.iterdir())


def test_a_profile_store_the_os_refuses_is_named_by_its_flag(tmp_path, capsys):
    """``simulate``/``serve --profile-store <300 characters>``: an ``OSError`` from ``exists()``."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for store, says in (("x" * 300, "File name too long"), (str(tmp_path / "loop1"), "Too many levels of symbolic")):
        refused(_simulate(tmp_path, "--policy", "arena", "--profile-store", store), capsys,
                f"field '--profile-store': cannot be used: {says}")


@pytest.mark.parametrize("flag,value,says", [
    ("--db", "x" * 300, "field '--db': cannot be used as the state database: File name too long"),
    ("--db", "d/" + "x" * 300 + "/s.db", "field '--db': cannot be created: the name"),
    ("--work-dir", "loop1", "field '--work-dir': cannot be used: Too many levels of symbolic links"),  # RuntimeError
    ("--work-dir", "d/" + "x" * 300, "field '--work-dir': cannot be created: the name"),
    ("--data-root", "x" * 300, "field '--data-root': cannot be used: File name too long"),
    ("--keep-rounds", "99999999999999999999", "field '--keep-rounds': must be at most 9,223,372,036,854,775,807 "
                                              "(SQLite's largest integer), got 1e+20"),   # stopped the scheduler
])
def test_serve_refuses_paths_the_os_refuses_and_counts_past_sqlite_before_making_anything(
        tmp_path, capsys, monkeypatch, flag, value, says):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    argv = ["serve", "--local-slots", "2", "--db", "s.db", "--work-dir", "w"]
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    refused(argv, capsys, says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop1", "loop2"]


# ------------------------------------------------------------------------ bench
def test_the_greedy_backends_unproved_gap_is_a_dash_with_a_legend_and_null_in_json(capsys):
    """D4: printed ``inf``; ``--json`` stays strict JSON (``null``)."""
    base = ["bench", "solver", "--gpus", "8", "--jobs", "2", "--repeat", "1", "--backend", "greedy",
            "--backend", "highs"]
    assert main(base) == 0
    out, err = capsys.readouterr()
    greedy = next(ln for ln in out.splitlines() if ln.startswith("greedy"))
    assert "inf" not in out and "inf" not in err and greedy.split()[7] == "-", out
    assert "(max gap -: no gap proved" in out
    assert main(base + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert [r["max_gap"] is None for r in rows] == [True, False]


def test_a_run_with_a_non_finite_jct_is_refused_by_bench_bound(tmp_path, capsys):
    """D6: ``nan nanx`` and exit 0."""
    run = tmp_path / "r"
    assert main(["simulate", "--instance", "demo", "--run-out", "--out", str(run), "--no-plots", "--quiet"]) == 0
    capsys.readouterr()
    rows = list(csv.DictReader((run / "jobs.csv").open()))
    for bad, says in (("nan", "must be a finite number of seconds, got nan"), ("inf", BOUND), ("-5", "must be >= 0")):
        rows[1]["jct_s"] = bad
        with (run / "jobs.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        refused(["bench", "bound", "--instance", "demo", str(run)], capsys,
                f"{run}/jobs.csv, line 3, field 'jct_s': job '{rows[1]['job_id']}': {says}")


# ------------------------------------------------------------------------ train (before any rank)
TRAIN = ["train", "--model", "tiny-gpt__2L", "--plan", "dp=1", "--steps", "2", "--dry-run"]


def _train(**flags: str) -> list[str]:
    argv = list(TRAIN)
    for flag, v in flags.items():
        flag = "--" + flag.replace("_", "-")
        if flag in argv:
            argv[argv.index(flag) + 1] = v
        else:
            argv += [flag, v]
    return argv


@pytest.mark.parametrize("flags,says", [
    ({"plan": "dp=99999999999999999999"}, "field '--plan': dp*tp*pp = 1e+20 ranks, more than the 1,048,576 GPUs"),
    ({"plan": "dp=1024,tp=1024,pp=2"}, "field '--plan': dp*tp*pp = 2097152 ranks"),      # D7: passed the dry run
    ({"microbatches": "99999999999"}, "field '--microbatches': must be at most 1,048,576"),
    ({"steps": "99999999999999999999"}, "field '--steps': must be at most 1,000,000,000, got 1e+20"),
    ({"global_batch": "99999999999"}, "field '--global-batch': must be at most 1,048,576"),
    ({"seed": "99999999999999999999"}, "field '--seed': must be at most 9,223,372,036,854,775,807"),
    ({"stage_layers": ""}, "field '--stage-layers': is empty"),                         # D8: ignored
    ({"plan": "dp=1,pp=2", "stage_layers": ","}, "field '--stage-layers': expected comma-separated integers"),
    ({"plan": "dp=1,pp=2", "stage_layers": "1,,1"}, "field '--stage-layers': expected comma-separated integers"),
])
def test_train_refuses_plans_and_numbers_past_their_bounds_before_any_rank(tmp_path, capsys, monkeypatch,
                                                                           flags, says):
    monkeypatch.chdir(tmp_path)
    refused(_train(**flags), capsys, says)


def test_a_seed_up_to_the_bound_draws_its_batches_and_small_seeds_draw_as_before():
    """The data streams' seed, ``seed * stride + step + 1``, overflowed torch's 64-bit
    seed for a seed the service accepts (2^63 - 1): the rank failed. Modulo 2^64 now;
    below 2^64 / stride the same streams as before."""
    import torch

    from instances.limits import MAX_SEED
    from launcher.data import STEP_SEED_STRIDE, SyntheticTokens, step_generator
    big = SyntheticTokens(vocab_size=50, seq_len=8, seed=MAX_SEED).global_batch(3, 2)
    assert big[0].shape == (2, 8)
    before = torch.Generator().manual_seed(7 * STEP_SEED_STRIDE + 3 + 1)
    assert torch.equal(torch.randint(0, 9, (5,), generator=step_generator(7, 3)),
                       torch.randint(0, 9, (5,), generator=before))


# ------------------------------------------------------------------------ estimate, profile
EST = ["estimate", "--model", "gpt__350M", "--gpu-type", "a100", "--gpus", "8"]


@pytest.mark.parametrize("extra,says", [
    (["--link-load", "2"], "field '--link-load': must be a fraction of the links' capacity in [0, 1]"),   # D9: inf
    (["--link-load", "1e308"], "field '--link-load': must be a fraction of the links' capacity in [0, 1]"),
    (["--link-load", "nan"], "field '--link-load': must be a fraction"),
    (["--link-load", "0.5", "--perf", "table"], "field '--link-load': --perf table does not read it"),  # ignored
    (["--gpus", "9" * 22], "field '--gpus': must be in 1..1,048,576 (the GPUs a cluster may have), got 1e+22"),
    (["--gpus-per-node", "99999999999"], "field '--gpus-per-node': must be in 1..1,048,576"),
    (["--profile-store", "x" * 300], "field '--profile-store': cannot be used: File name too long"),
])
def test_estimate_refuses_a_link_load_past_a_fraction_and_counts_past_a_cluster(capsys, extra, says):
    refused(EST + extra, capsys, says)


def test_estimate_refuses_refit_starts_it_does_not_have_and_a_store_it_cannot_write(tmp_path, capsys):
    refused(["estimate", "accuracy", "--refit-analytic", "--refit-starts", "10"], capsys,
            "field '--refit-starts': must be in 1..9 (the neutral start and the corner starts), got 10")
    (tmp_path / "f").write_text("x")
    refused(["estimate", "accuracy", "--against", "local", "--store", str(tmp_path / "f")], capsys,
            "field '--store': exists and is not a directory")
    refused(["estimate", "accuracy", "--against", "local", "--passes", "99999999999"], capsys,
            "field '--passes': must be in 1..1,000")
    refused(["estimate", "accuracy", "--refit-evals", "-1"], capsys,          # passed over, then a minute of work
            "field '--refit-evals': is read only with --refit-analytic")
    refused(["estimate", "accuracy", "--refit-analytic", "--refit-evals", "99999999999999999999"], capsys,
            "field '--refit-evals': must be in 1..10,000, got 1e+20")
    refused(["estimate", "proxy-quality", "--max-splits", "99999999999999999999"], capsys,   # never ended
            "field '--max-splits': must be in 1..10,000")


PROFILE = ["profile", "--model", "tiny-gpt__2L", "--tp", "1"]


@pytest.mark.parametrize("extra,says", [
    (["--micro-batches", "100000000"], "field '--micro-batches': a micro-batch of 100000000 would hold about"),  # D10
    (["--micro-batches", "1", "1500"], "more than the 256 MiB a measurement may take: give at most 1,489"),
    (["--micro-batches", "9" * 400], "a micro-batch of an integer of about 400 digits would hold about more bytes"),
    (["--group-sizes", "100000"], "field '--group-sizes': a group of 100000 processes, more than the"),       # D11
    (["--group-sizes", "2", "--no-collectives"], "field '--group-sizes': given with --no-collectives"),
    (["--repeats", "1000000000"], "field '--repeats': must be in 1..1,000, got 1000000000"),
    (["--run-grids", "99999"], "field '--run-grids': must be in 0.."),
])
def test_profile_refuses_what_would_blow_up_or_never_end_before_profiling(tmp_path, capsys, extra, says):
    refused(PROFILE + ["--store", str(tmp_path / "st")] + extra, capsys, says)
    assert not (tmp_path / "st").exists()


def test_a_collective_group_larger_than_the_host_is_refused_not_skipped():
    """On CUDA a group past the GPUs was skipped without a word; on a CPU past the cores
    it measured their sharing. The library call refuses it too."""
    from estimators.profiler import local_ranks, profile_collectives
    ranks, what = local_ranks()
    with pytest.raises(InputError) as e:
        profile_collectives(group_sizes=(ranks + 1,))
    assert e.value.field == "group_sizes" and f"more than the {ranks} {what}" in e.value.reason


# ------------------------------------------------------------------------ files
def test_an_outage_file_with_cr_only_line_endings_is_read(tmp_path):
    """F1: a ``csv.Error`` traceback; read as Python's text files read it (a trace too)."""
    from instances.cluster import ClusterSpec, NodeGroup
    from instances.outages import load_outages
    p = tmp_path / "cr.csv"
    p.write_bytes(b"node,start_s,end_s\r0,10,20\r1,5,\r")
    out = load_outages(p, ClusterSpec((NodeGroup("a100", 2, 4),)))
    assert [(o.node, o.start_s, o.end_s) for o in out] == [(1, 5.0, math.inf), (0, 10.0, 20.0)]


def test_a_hostfile_with_cr_only_line_endings_is_refused_before_mpiexec_reads_it(tmp_path, capsys):
    """Read as two hosts by the dry run, but mpiexec reads the file itself and fails on it
    ("token localhost:3 not supported"); CRLF, which mpiexec reads, stays accepted."""
    from launcher.launch import hostfile_hosts
    (tmp_path / "crlf").write_bytes(b"localhost:1\r\nlocalhost:3\r\n")
    assert hostfile_hosts(tmp_path / "crlf") == [("localhost", 1), ("localhost", 3)]
    (tmp_path / "cr").write_bytes(b"localhost:1\r\nlocalhost:3\rlocalhost:2\r")
    refused(_train(plan="dp=2", hostfile=str(tmp_path / "cr")), capsys,
            f"{tmp_path / 'cr'}, line 2: a line ends with a lone carriage return (old Mac line endings), which "
            "mpiexec cannot read")


def test_a_trace_models_config_error_names_the_config_file_and_its_key(tmp_path, capsys):
    """F2: ``field 'model': 1000000000 is more than 4096``, without the file or the key."""
    cfg = tmp_path / "big.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 10**9, "n_embd": 64, "n_head": 4, "n_positions": 32,
                               "vocab_size": 100}))
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"schema_version": 1, "name": "c", "node_groups": [
        {"gpu_type": "a100", "num_nodes": 1, "gpus_per_node": 8}]}))
    trace = tmp_path / "t.csv"
    trace.write_text("# arena-trace v1\njob_id,model,global_batch,num_iterations,arrival_s,deadline_s,priority,tenant,"
                     f"requested_gpu_type,requested_gpus\nj1,{cfg},8,10,0.0,,1.0,t,,1\n")
    refused(["simulate", "--cluster", str(cluster), "--trace", str(trace), "--out", str(tmp_path / "o")], capsys,
            f"{trace}, line 3, field 'model': {cfg}, field 'n_layer': must be at most 4,096 (layers or experts: "
            "more than any real model has), got 1000000000")


def _state(tmp_path: Path, damage: str | None = None) -> Path:
    from engine.service.jobspec import JobSpec
    from engine.service.store import Store
    db = tmp_path / "s.db"
    with Store(db) as st:
        for name in ("a", "b"):
            st.jobs.submit(JobSpec.from_dict({"name": name, "model": "tiny-gpt__2L", "global_batch": 8, "steps": 3}))
    if damage:
        con = sqlite3.connect(db)
        con.execute("PRAGMA foreign_keys = OFF")
        con.execute(damage)
        con.commit()
        con.close()
    return db


@pytest.mark.parametrize("damage,says", [
    # (the state's check at start, engine/service/store, names these two before the export reads a row)
    ("UPDATE jobs SET spec = '{' WHERE id = 2", "field '--db': the state database is damaged: job 2: its spec "
                                                "cannot be read (not JSON"),
    ("DROP TABLE jobs", "field 'jobs': the state database is damaged: it has no table 'jobs'"),
    ("UPDATE jobs SET submitted_at = 'x' WHERE id = 1", "field 'jobs.submitted_at': job 1: its submission time 'x'"),
])
def test_export_trace_names_what_is_damaged_in_the_state_and_how_to_restore(tmp_path, capsys, damage, says):
    """F3: a ``JSONDecodeError`` / ``OperationalError`` traceback."""
    db = _state(tmp_path, damage)
    line = refused(["export-trace", "--db", str(db), "--out", str(tmp_path / "t.csv")], capsys, f"{db}, {says}")
    assert "from a backup" in line and not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_export_trace_refuses_a_state_file_name_before_it_exists(tmp_path, capsys, suffix):
    """F5: taken while the file did not exist; SQLite would then read the trace as its log."""
    db = _state(tmp_path)
    out = Path(f"{db}{suffix}")
    out.unlink(missing_ok=True)
    refused(["export-trace", "--db", str(db), "--out", str(out)], capsys,
            f"{out}, field '--out': is the state database {db} or one of its files")
    assert not out.exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_an_output_that_cannot_be_written_is_an_error_naming_it(tmp_path, capsys):
    """F4: ENOSPC traceback. The same for every file output written through
    ``paths.write_output`` (export-trace, outages); a pipe nobody reads would wait forever."""
    db = _state(tmp_path)
    refused(["export-trace", "--db", str(db), "--out", "/dev/full"], capsys,
            "/dev/full, field '--out': could not be written: No space left on device")
    refused(["outages", "--mtbf-hours", "9", "--repair-hours", "1", "--hours", "9", "--out", "/dev/full"], capsys,
            "/dev/full, field '--out': could not be written: No space left on device")
    os.mkfifo(tmp_path / "fifo")
    refused(["export-trace", "--db", str(db), "--out", str(tmp_path / "fifo")], capsys,
            "field '--out': is a pipe that nothing reads: writing it would wait forever")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_outputs_that_only_a_regular_file_can_be_are_refused_before_the_work(tmp_path, capsys, monkeypatch):
    """``estimate fit --out`` a pipe waited, ``/dev/full`` failed, after minutes of fitting;
    ``train --telemetry /dev/full`` passed the dry run and failed in every rank; ``bench
    bound --plot /dev/full`` printed ``wrote /dev/full``."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    for out in ("fifo", "/dev/full"):
        refused(["estimate", "fit", "--out", out], capsys, "field '--out': is not a regular file (a pipe, a device "
                                                           "or a socket): the artifact is a file that policies load")
        refused(_train(telemetry=out), capsys, "field '--telemetry': is not a regular file (a pipe, a device or a "
                                               "socket): every rank appends its steps to it")
    refused(["estimate", "fit", "--out", "x" * 300], capsys, "field '--out': cannot be used: File name too long")
    refused(["bench", "bound", "--instance", "demo", "--plot", "/dev/full"], capsys,
            "/dev/full, field '--plot': could not be written: No space left on device")
    refused(["bench", "bound", "--instance", "demo", "--max-gpus", "99999999999999999999"], capsys,
            "field '--max-gpus': must be in 1..1,048,576 (the GPUs a cluster may have), got 1e+20")


@pytest.mark.parametrize("command", ["export-trace", "backup"])
def test_the_database_commands_name_a_path_the_os_refuses_or_a_pipe(tmp_path, capsys, monkeypatch, command):
    """``--db``/``--out`` of 300 characters: ``OSError`` from ``is_dir()``/``exists()``; a
    pipe as ``--db``: SQLite's ``disk I/O error``."""
    monkeypatch.chdir(tmp_path)
    db = _state(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    long = "x" * 300
    refused([command, "--db", long, "--out", "o"], capsys, "field '--db': cannot be used: File name too long")
    refused([command, "--db", str(db), "--out", long], capsys, "field '--out': cannot be used: File name too long")
    refused([command, "--db", "fifo", "--out", "o"], capsys,
            "fifo, field '--db': not a regular file (a pipe, a device or a socket): not a state database")
    assert not (tmp_path / "o").exists()


def test_a_written_file_keeps_its_permissions_and_is_written_through_a_link(tmp_path):
    """``write_output`` writes beside and renames: as ``open()`` did, a new file gets the
    umask's permissions (not ``mkstemp``'s 0600), a replaced one keeps its own, and a link
    is written through, not replaced."""
    from instances.paths import write_output
    umask = os.umask(0o022)
    try:
        write_output(tmp_path / "new.csv", "a")
        assert (tmp_path / "new.csv").stat().st_mode & 0o777 == 0o644
        (tmp_path / "kept.csv").write_text("x")
        (tmp_path / "kept.csv").chmod(0o640)
        (tmp_path / "link.csv").symlink_to(tmp_path / "kept.csv")
        write_output(tmp_path / "link.csv", "b")
    finally:
        os.umask(umask)
    assert (tmp_path / "link.csv").is_symlink() and (tmp_path / "kept.csv").read_text() == "b"
    assert (tmp_path / "kept.csv").stat().st_mode & 0o777 == 0o640


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    from instances import paths
    target = tmp_path / "t.csv"
    target.write_text("before")

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(paths.os, "replace", full)
    with pytest.raises(InputError) as e:
        paths.write_output(target, "after", "--out")
    assert e.value.field == "--out" and target.read_text() == "before" and [p.name for p in tmp_path.iterdir()] == [
        "t.csv"]


# ------------------------------------------------------------------------ the clients
@pytest.mark.parametrize("url,says", [
    ("http://[::1", "field '--url': is not a URL (Invalid IPv6 URL), got 'http://[::1'"),      # F6
    ("http://h:99999", "field '--url': is not a URL (Port out of range 0-65535)"),
    ("http://", "field '--url': names no host"),
    ("http://a b", "field '--url': must not hold spaces or control characters"),
    ("http://" + "h" * 300, "field '--url': names a host that cannot be looked up"),
])
def test_a_url_the_client_cannot_use_is_refused_by_its_flag(capsys, monkeypatch, url, says):
    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    refused(["jobs", "--url", url], capsys, says)


def test_a_token_with_a_line_break_is_refused_naming_where_it_came_from(capsys, monkeypatch):
    """F7: ``ValueError: Invalid header value``; the token itself is never printed."""
    monkeypatch.setenv("ARENA_TOKEN", "abcdefgh12345678\nX-Evil: 1")
    monkeypatch.setenv("ARENA_URL", "http://[::1")
    line = refused(["jobs", "--url", "http://127.0.0.1:9"], capsys,
                   "field 'ARENA_TOKEN': the token may hold only visible ASCII characters")
    assert "abcdefgh" not in line and "Evil" not in line
    line = refused(["jobs", "--token", "tok\u00e9n-123456789ABC"], capsys, "field '--token': the token may hold only")
    monkeypatch.delenv("ARENA_TOKEN")
    refused(["jobs"], capsys, "field 'ARENA_URL': is not a URL (Invalid IPv6 URL)")
