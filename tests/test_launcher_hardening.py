"""Issue 13, training runs that lose work: checkpoint defaults, paths and device checked
before launch, the checkpoint's global batch on resume, "resuming from step N", --steps
below the checkpoint, a reused run folder, rank death and stalls reported in one line,
temporary run folders removed; and the kill test from a new user's view (slow)."""
from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from engine.cli.main import main
from instances.errors import InputError
from launcher.api import STALLED_RC, describe_failure, make_config, run_training
from launcher.config import DEFAULT_CHECKPOINT_INTERVAL_S, ParallelPlan, TrainConfig
from launcher.launch import MPICH_NOISE, LogEcho, archive_previous_launch, rank_exit_codes, rank_pids
from launcher.validate import check_device, validate

MODEL = "tiny-gpt__2L"


def cfg(tmp_path, **kw) -> TrainConfig:
    return TrainConfig(model=MODEL, plan=ParallelPlan(dp=2), steps=kw.pop("steps", 200),
                       run_dir=str(tmp_path / "run"), **kw)


def fake_checkpoint(directory: Path, step: int, global_batch: int = 2) -> Path:
    d = directory / f"step_{step:08d}"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"model": MODEL, "seed": 0, "global_batch": global_batch,
                                             "plan": "dp=2,tp=1,pp=1", "step": step}))
    return d


def test_periodic_checkpoints_by_default_whenever_a_folder_is_given(tmp_path):
    c = cfg(tmp_path, checkpoint_dir=str(tmp_path / "ck"))
    assert c.checkpoint_every == 20 and c.checkpoint_interval_s == DEFAULT_CHECKPOINT_INTERVAL_S
    none = cfg(tmp_path)
    assert none.checkpoint_every == 0 and none.checkpoint_interval_s == 0
    off = cfg(tmp_path, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=0, checkpoint_interval_s=0)
    assert off.checkpoint_every == 0 and off.checkpoint_interval_s == 0
    assert TrainConfig.from_json(c.to_json()) == c
    with pytest.raises(InputError, match="checkpoint_every"):
        cfg(tmp_path, checkpoint_every=-1)


def test_bad_paths_are_refused_before_launch(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for kw, field in ((dict(checkpoint_dir=str(a_file)), "checkpoint_dir"),
                      (dict(checkpoint_dir=str(a_file / "sub")), "checkpoint_dir"),
                      (dict(data_path="/nonexistent/data.txt"), "data"),
                      (dict(data_path=str(tmp_path)), "data"),
                      (dict(telemetry_path=str(tmp_path)), "telemetry_path")):
        with pytest.raises(InputError) as e:
            validate(cfg(tmp_path, **kw))
        assert e.value.field == field, kw
    bad_run = TrainConfig(model=MODEL, plan=ParallelPlan(dp=2), steps=5, run_dir=str(a_file))
    with pytest.raises(InputError, match="not a directory"):
        validate(bad_run)


def test_cuda_without_a_gpu_is_an_input_error(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(InputError, match="no CUDA GPU") as e:
        check_device(cfg(tmp_path, device="cuda"))
    assert e.value.field == "device"


def test_resume_takes_the_checkpoints_global_batch(tmp_path):
    ck = tmp_path / "ck"
    fake_checkpoint(ck, 10, global_batch=2)
    # a plan whose default batch (dp * microbatches = 1) differs from the checkpoint's
    assert make_config(MODEL, 1, 1, 1, steps=20, checkpoint_dir=ck, run_dir=tmp_path / "r").global_batch == 2
    assert make_config(MODEL, 1, 1, 1, steps=20, checkpoint_dir=ck, global_batch=4,
                       run_dir=tmp_path / "r").global_batch == 4
    assert make_config(MODEL, 1, 1, 1, steps=20, run_dir=tmp_path / "r").global_batch == 1


def test_steps_below_the_checkpoint_are_explained_without_launching(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ck = tmp_path / "ck"
    fake_checkpoint(ck, 200)
    assert main(["train", "--model", MODEL, "--plan", "dp=1", "--steps", "100", "--checkpoint-dir", str(ck),
                 "--no-record"]) == 0
    out = capsys.readouterr().out
    assert "at step 200, at or past --steps 100: nothing to train" in out and "--steps 300" in out
    assert not list(tmp_path.glob("arena-train-*"))         # the temporary run folder is gone


def test_checkpoint_dir_that_is_a_file_fails_before_launch(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "ck").write_text("")
    assert main(["train", "--model", MODEL, "--plan", "dp=2", "--steps", "5", "--checkpoint-dir",
                 str(tmp_path / "ck"), "--no-record"]) == 2
    assert "field '--checkpoint-dir': exists and is not a directory" in capsys.readouterr().err
    assert not list(tmp_path.glob("arena-train-*"))


def test_reused_run_dir_keeps_the_earlier_launch_apart(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text('{"step": 1}\n')
    (run / "stdout.log").write_text("old\n")
    assert archive_previous_launch(run) == run / "previous" / "1"
    assert not (run / "results.jsonl").exists() and (run / "previous" / "1" / "results.jsonl").is_file()
    (run / "results.jsonl").write_text('{"step": 2}\n')
    assert archive_previous_launch(run) == run / "previous" / "2"
    assert archive_previous_launch(run) is None


def test_rank_death_is_one_line_with_rank_checkpoint_and_how_to_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "stdout.log").write_text("step 1\n[mpiexec@vm] Exit codes: [vm] 0,9\n")
    assert rank_exit_codes(run) == {0: 0, 1: 9}
    ck = tmp_path / "ck"
    fake_checkpoint(ck, 20)
    c = cfg(tmp_path, checkpoint_dir=str(ck))
    line = describe_failure(c, 9, [{"step": 27}])
    assert line == (f"rank 1 died (killed by SIGKILL) after step 27; last checkpoint: step 20 in {ck}; "
                    f"run the same command again to resume from it")
    assert "\n" not in line
    assert "stalled: no step finished for 120 s" in describe_failure(c, STALLED_RC, [{"step": 3}])
    assert "no --checkpoint-dir was given" in describe_failure(cfg(tmp_path), 9, [])


def test_echo_leaves_out_mpich_banner(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    banner = ["", "=" * 83, "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "=   PID 9792 RUNNING AT vm",
              "=" * 83, "[mpiexec@vm] Exit codes: [vm] 0,9",
              "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)",
              "This typically refers to a problem with your application.",
              "Please see the FAQ page for debugging suggestions"]
    (run / "stdout.log").write_text("step 1 loss 5.0 time_s 0.1\n" + "\n".join(banner) + "\n")
    echo = LogEcho(run).start()
    echo.stop()
    assert capsys.readouterr().out == "step 1 loss 5.0 time_s 0.1\n\n"
    assert all(MPICH_NOISE.match(b.strip()) for b in banner if b)


# ---------------------------------------------------------------------------- real MPI runs
def _when_steps(run_dir: Path, n: int, action, timeout_s: float = 90.0) -> threading.Thread:
    """In a thread: once rank 0 has recorded ``n`` steps, call ``action(pids)``."""
    def watch():
        t_end = time.monotonic() + timeout_s
        while time.monotonic() < t_end:
            try:
                lines = (run_dir / "results.jsonl").read_text().splitlines()
            except FileNotFoundError:
                lines = []
            if len(lines) >= n and len(rank_pids(run_dir)) == 2:
                action(rank_pids(run_dir))
                return
            time.sleep(0.02)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_kill_a_rank_and_rerun_from_a_new_users_view(tmp_path, capsys):
    """`arena train` with only --checkpoint-dir; rank 1 SIGKILLed mid-run; the same command
    again: it says it resumes, loses at most one checkpoint interval, and the losses are the
    uninterrupted run's."""
    from launcher.reference import train_reference

    steps, ck, run = 60, tmp_path / "ck", tmp_path / "run"
    args = ["train", "--model", MODEL, "--plan", "dp=2", "--steps", str(steps), "--checkpoint-dir", str(ck),
            "--run-dir", str(run), "--no-record", "--step-delay", "0.1"]
    killer = _when_steps(run, 25, lambda pids: os.kill(pids[1][0], signal.SIGKILL))
    assert main(args) == 1
    killer.join()
    first = capsys.readouterr()
    every = steps // 10
    assert f"checkpoints in {ck}: every {every} steps" in first.out
    died = [line for line in first.err.splitlines() if "rank 1 died" in line]
    assert len(died) == 1 and "killed by SIGKILL" in died[0] and "run the same command again" in died[0]
    killed_at = _steps(run / "results.jsonl")[-1]["step"]

    assert main(args) == 0
    second = capsys.readouterr().out
    resumed = _steps(run / "results.jsonl")[0]["step"] - 1
    assert f"resuming from step {resumed} " in second
    assert f"last checkpoint: step {resumed} " in died[0]
    assert 0 <= killed_at - resumed <= every                    # at most one interval of steps lost
    losses = [r["loss"] for r in _steps(run / "previous" / "1" / "results.jsonl")[:resumed]] + \
        [r["loss"] for r in _steps(run / "results.jsonl")]
    ref = train_reference(MODEL, steps=steps, global_batch=2, seed=0)
    assert len(losses) == steps and max(abs(a - b) for a, b in zip(losses, ref)) < 1e-4


@pytest.mark.slow
def test_a_frozen_rank_is_reported_as_a_stall(tmp_path):
    run = tmp_path / "run"
    freezer = _when_steps(run, 5, lambda pids: os.kill(pids[1][0], signal.SIGSTOP))
    t0 = time.monotonic()
    r = run_training(MODEL, 2, 1, 1, steps=100000, run_dir=run, stall_timeout_s=4.0, step_delay_s=0.05,
                     checkpoint_dir=tmp_path / "ck", checkpoint_every=2, timeout_s=120)
    freezer.join()
    assert r.returncode == STALLED_RC and time.monotonic() - t0 < 60
    assert r.failure.startswith("the job stalled: no step finished for 4 s after step ")
    ckpt = re.search(r"; last checkpoint: step (\d+) in ", r.failure)
    assert ckpt and int(ckpt.group(1)) >= 4 and int(ckpt.group(1)) % 2 == 0 and "\n" not in r.failure


def test_measured_runs_log_is_bounded(tmp_path):
    from launcher.logbound import bound_jsonl
    log = tmp_path / "measured_runs.jsonl"
    lines = [json.dumps({"step": i, "pad": "x" * 50}) + "\n" for i in range(1000)]
    log.write_text("".join(lines))
    size = log.stat().st_size
    assert bound_jsonl(log, max_bytes=size) == 0                 # under the bound: untouched
    dropped = bound_jsonl(log, max_bytes=size // 4)
    kept = log.read_text().splitlines()
    assert dropped == 1000 - len(kept) and 0 < log.stat().st_size <= size // 8
    assert [json.loads(k)["step"] for k in kept] == list(range(1000 - len(kept), 1000))   # the newest
    assert bound_jsonl(tmp_path / "missing.jsonl", 10) == 0


def finite_checkpoint(path: Path, scratch: Path) -> bool:
    """Whether every floating-point tensor of the checkpoint at ``path`` (weights and Adam
    state, all ranks' shards) is finite; read without a process group."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(path, scratch)
    found: list = []

    def walk(x):
        if torch.is_tensor(x):
            found.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(torch.load(scratch, weights_only=False))
    floats = [t for t in found if t.is_floating_point()]
    return bool(floats) and all(bool(torch.isfinite(t).all()) for t in floats)


def test_lr_must_be_a_finite_number_above_zero(tmp_path, capsys):
    for lr in ("inf", "nan", "0", "-1e-3", "1e400", "1e38"):
        assert main(["train", "--model", MODEL, "--plan", "dp=1", "--steps", "5", f"--lr={lr}", "--dry-run",
                     "--no-record"]) == 2, lr
        err = capsys.readouterr().err
        assert "field '--lr': must be a finite number > 0" in err or \
            "field '--lr': must be at most 3.4e+37: Adam's first step size" in err, err
    assert main(["train", "--model", MODEL, "--plan", "dp=1", "--steps", "5", "--lr", "1e30", "--dry-run",
                 "--no-record"]) == 0


def test_train_data_is_checked_before_launch(tmp_path, capsys):
    from instances.models import get_model
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * (get_model(MODEL).seq_len + 1))       # (seq_len 32)
    for data, words in ((fifo, "not a regular file"), (tmp_path, "is a folder"),
                        (short, "holds 33 bytes; the model needs at least 34")):
        t0 = time.monotonic()
        assert main(["train", "--model", MODEL, "--plan", "dp=1", "--steps", "5", "--data", str(data),
                     "--dry-run", "--no-record"]) == 2
        err = capsys.readouterr().err
        assert f"{data}, field '--data': {words}" in err and time.monotonic() - t0 < 10, err


@pytest.mark.slow
def test_a_non_finite_loss_stops_the_run_keeping_the_last_finite_checkpoint(tmp_path, capsys):
    """``--lr 1e30``: the loss is nan at step 2; the run stops there, keeps its step-1
    checkpoint (never overwritten with nan weights), says so in one line and exits 3."""
    ck = tmp_path / "ck"
    rc = main(["train", "--model", MODEL, "--plan", "dp=2", "--steps", "6", "--lr", "1e30", "--checkpoint-dir",
               str(ck), "--checkpoint-every", "1", "--run-dir", str(tmp_path / "run"), "--no-record"])
    err = capsys.readouterr().err
    assert rc == 3, err
    line = next(line for line in err.splitlines() if line.startswith("arena train: training stopped"))
    assert line.startswith("arena train: training stopped at step 2: the loss is nan (not finite); nothing was "
                           f"saved after it; the last checkpoint kept is step 1 in {ck} (all finite)"), line
    from launcher.checkpoint import latest_checkpoint
    assert latest_checkpoint(ck)[0] == 1 and sorted(p.name for p in ck.iterdir()) == ["step_00000001"]
    assert finite_checkpoint(ck / "step_00000001", tmp_path / "flat.pt")


def test_a_save_with_non_finite_weights_is_refused_and_keeps_the_last_checkpoint(tmp_path):
    """The guard behind a finite loss: a save whose weights (or Adam state) hold a
    non-finite value on any rank is not made (one rank, in this process, over gloo)."""
    import socket

    import torch
    import torch.distributed as dist

    from launcher.checkpoint import latest_checkpoint
    from launcher.dist import make_env
    from launcher.worker import RankRun

    ck = tmp_path / "ck"
    c = TrainConfig(model=MODEL, plan=ParallelPlan(), steps=3, checkpoint_dir=str(ck), run_dir=str(tmp_path / "run"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        run = RankRun(c, make_env(c.plan, 0, 1, 0, torch.device("cpu"), socket.gethostname()), 0.0, 0.0)
        run.setup()
        run.build_schedule_and_data()
        run.step(0)
        assert run.save(1, "periodic") and latest_checkpoint(ck)[0] == 1
        run.step(1)
        with torch.no_grad():
            next(run.model.parameters())[0].fill_(float("inf"))
        assert not run.save(2, "periodic") and latest_checkpoint(ck)[0] == 1
        run.stop_nonfinite(2, "the weights hold non-finite values")
        assert run.reason.startswith(f"training stopped at step 2: the weights hold non-finite values; nothing was "
                                     f"saved after it; the last checkpoint kept is step 1 in {ck}")
    finally:
        dist.destroy_process_group()
    assert finite_checkpoint(ck / "step_00000001", tmp_path / "flat.pt")
