"""Python API: train a catalog model with a given plan under mpiexec and return what it
measured (used by the estimators' calibration and by the tests)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import latest_checkpoint, read_meta
from .config import OptimizerConfig, ParallelPlan, TrainConfig
from .launch import (
    LogEcho,
    kill_job,
    last_sign_of_life,
    rank_exit_codes,
    ranks_not_done,
    read_events,
    read_results,
    start,
    tail,
)
from .telemetry import NONFINITE, read_progress
from .validate import validate
from .worker import NONFINITE_EXIT

STOP_GRACE_S = 10.0          # after the timeout: SIGTERM (checkpoint + exit), then SIGKILL
POLL_S = 0.2                 # how often run_config looks at the job
TIMED_OUT_RC = 124           # TrainResult.returncode when the timeout stopped the job
STALLED_RC = 125             # ... when no step came for stall_timeout_s (the job was killed)
KILL_SIGNALS = (signal.SIGABRT, signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM, signal.SIGBUS)
TEMP_PREFIX = "arena-train-"  # run folders run_config may remove (created by make_config)


@dataclass(frozen=True)
class TrainResult:
    steps: tuple[int, ...]                  # 1-based step numbers trained by this launch
    losses: tuple[float, ...]               # loss per step (mean over the global batch)
    iteration_times_s: tuple[float, ...]    # wall time per step, measured on rank 0
    wall_time_s: float                      # launch to exit, including start-up
    returncode: int                         # mpiexec's exit status (124: timed out; 3: NONFINITE_EXIT)
    start_step: int                         # the step resumed from (0: fresh start)
    run_dir: str
    events: tuple[dict, ...] = ()
    output_tail: str = ""                   # end of the ranks' stderr (failed: + exit status, stdout)
    failure: str = ""                       # one line saying what went wrong and how to resume ("" if ok;
                                            # a non-finite stop: the worker's reason)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def make_config(model: str, dp: int, tp: int, pp: int, *, steps: int, microbatches: int = 1,
                schedule: str = "1f1b", global_batch: int | None = None, seed: int = 0,
                checkpoint_dir=None, telemetry_path=None, telemetry_store=None, run_dir=None,
                **extra) -> TrainConfig:
    run_dir = str(run_dir) if run_dir else tempfile.mkdtemp(prefix=TEMP_PREFIX)
    if global_batch is None:
        global_batch = checkpoint_global_batch(checkpoint_dir)
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, microbatches=microbatches, schedule=schedule,
                        stage_layers=tuple(extra.pop("stage_layers", ())))
    if "optimizer" in extra and isinstance(extra["optimizer"], dict):
        extra["optimizer"] = OptimizerConfig(**extra["optimizer"])
    return TrainConfig(model=model, plan=plan, steps=steps, global_batch=global_batch, seed=seed,
                       checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
                       telemetry_path=str(telemetry_path) if telemetry_path else None,
                       telemetry_store=str(telemetry_store) if telemetry_store else None,
                       run_dir=run_dir, progress_path=str(Path(run_dir) / "progress.json"),
                       **extra)


def checkpoint_global_batch(checkpoint_dir) -> int | None:
    """The global batch of the latest checkpoint in ``checkpoint_dir`` (None: none there):
    a resume keeps it unless told otherwise, so it works on a plan whose default differs."""
    found = latest_checkpoint(checkpoint_dir)
    return None if found is None else read_meta(found[1]).get("global_batch")


def _stop(proc: subprocess.Popen, run_dir: str) -> None:
    """SIGTERM to mpiexec (forwarded to every rank: checkpoint and exit), SIGKILL after a grace."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        kill_job(proc, run_dir, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _output_tail(run_dir, rc: int) -> str:
    """The ranks' stderr tail; for a failed launch also the exit status and stdout's tail
    (mpiexec reports a rank's bad termination there)."""
    err = tail(Path(run_dir) / "stderr.log")
    if rc == 0:
        return err
    return (f"{err}\n[mpiexec exit status {rc}; ranks that did not reach the end of training: "
            f"{ranks_not_done(run_dir) or 'none (a rank died while exiting)'}; stdout tail:]\n"
            f"{tail(Path(run_dir) / 'stdout.log', 1000)}")


def _wait(proc: subprocess.Popen, cfg: TrainConfig, timeout_s: float) -> int:
    """mpiexec's exit status; TIMED_OUT_RC after stopping it at the timeout; STALLED_RC after
    killing a job that, once started, finished no step for ``cfg.stall_timeout_s`` (start-up
    is bounded by the timeout and the collective timeout)."""
    run_dir, t_start = Path(cfg.run_dir), time.time()
    while True:
        rc = proc.poll()
        if rc is not None:
            return rc
        now = time.time()
        if now - t_start > timeout_s:
            _stop(proc, cfg.run_dir)        # ranks checkpoint (if a directory is set) and exit
            return TIMED_OUT_RC
        alive = last_sign_of_life(run_dir) if cfg.stall_timeout_s else None
        if alive is not None and now - alive > cfg.stall_timeout_s:
            # a frozen rank holds every other rank in a collective: no checkpoint is possible
            kill_job(proc, cfg.run_dir, signal.SIGKILL)
            proc.wait()
            return STALLED_RC
        time.sleep(POLL_S)


def describe_failure(cfg: TrainConfig, rc: int, results: list[dict]) -> str:
    """One line: what happened to the job, the last checkpoint, how to resume."""
    last_step = results[-1]["step"] if results else None
    found = latest_checkpoint(cfg.checkpoint_dir)
    if found is not None:
        resume = (f"last checkpoint: step {found[0]} in {cfg.checkpoint_dir}; run the same command again "
                  f"to resume from it")
    elif cfg.checkpoint_dir:
        resume = f"no checkpoint was completed in {cfg.checkpoint_dir}; a rerun starts from step 0"
    else:
        resume = "no --checkpoint-dir was given, so a rerun starts from step 0"
    at = f"after step {last_step}" if last_step is not None else "before its first step"
    if rc == STALLED_RC:
        what = (f"the job stalled: no step finished for {cfg.stall_timeout_s:.0f} s {at} (a rank froze or a "
                f"collective hung); it was stopped")
    elif rc == TIMED_OUT_RC:
        what = f"the job reached its timeout {at} and was stopped"
    else:
        codes = {r: c for r, c in rank_exit_codes(cfg.run_dir).items() if c != 0}
        if codes:
            def desc(c):        # Hydra reports a rank killed by a signal with the signal's number
                return f"killed by {signal.Signals(c).name}" if c in KILL_SIGNALS else f"exit status {c}"
            what = "; ".join(f"rank {r} died ({desc(c)})" for r, c in sorted(codes.items())) + f" {at}"
        else:
            dead = ranks_not_done(cfg.run_dir)
            what = (f"rank(s) {', '.join(map(str, dead))} did not finish" if dead else "mpiexec failed") + \
                f" (mpiexec exit status {rc}) {at}"
    return f"{what}; {resume}"


def _is_own_temp(run_dir: str) -> bool:
    p = Path(run_dir)
    return p.name.startswith(TEMP_PREFIX) and p.parent == Path(tempfile.gettempdir())


def run_config(cfg: TrainConfig, *, timeout_s: float = 120, hostfile: str | None = None,
               echo: bool = False, device_type: str = "cpu", keep_run_dir: bool = False) -> TrainResult:
    """Validate, launch, wait (SIGTERM at the timeout, SIGKILL after a grace period; SIGKILL
    when no step comes for ``cfg.stall_timeout_s``). ``echo``: copy the ranks' output to this
    process's stdout/stderr as it comes (without MPICH's banner). A successful run in a
    temporary folder from ``make_config`` (``arena-train-*``) is removed unless
    ``keep_run_dir``; a failed one is kept for its logs."""
    validate(cfg, device_type=device_type)
    t0 = time.perf_counter()
    proc = start(cfg, hostfile)
    echoer = LogEcho(cfg.run_dir).start() if echo else None
    try:
        rc = _wait(proc, cfg, timeout_s)
    except KeyboardInterrupt:
        _stop(proc, cfg.run_dir)
        raise
    finally:
        if echoer is not None:
            echoer.stop()
    wall = time.perf_counter() - t0
    results = read_results(cfg.run_dir)
    first = results[0]["step"] - 1 if results else 0
    prog = (read_progress(cfg.progress_path) or {}) if cfg.progress_path else {}
    nonfinite = rc == NONFINITE_EXIT and prog.get("status") == NONFINITE
    res = TrainResult(steps=tuple(r["step"] for r in results),
                      losses=tuple(r["loss"] for r in results),
                      iteration_times_s=tuple(r["iteration_time_s"] for r in results),
                      wall_time_s=wall, returncode=rc, start_step=first, run_dir=str(cfg.run_dir),
                      events=tuple(read_events(cfg.run_dir)),
                      output_tail=_output_tail(cfg.run_dir, rc),
                      failure="" if rc == 0 else str(prog.get("reason")) if nonfinite else
                      describe_failure(cfg, rc, results))
    if rc == 0 and not keep_run_dir and _is_own_temp(cfg.run_dir):
        shutil.rmtree(cfg.run_dir, ignore_errors=True)
    return res


def run_training(model: str, dp: int, tp: int, pp: int, *, steps: int, microbatches: int = 1,
                 schedule: str = "1f1b", global_batch: int | None = None, seed: int = 0,
                 checkpoint_dir=None, telemetry_path=None, timeout_s: float = 120,
                 **extra) -> TrainResult:
    """Train ``model`` on ``dp * tp * pp`` local ranks for ``steps`` total steps (resuming
    from ``checkpoint_dir`` if it holds a checkpoint). ``extra``: further ``TrainConfig``
    fields (``telemetry_store``, ``checkpoint_every``, ``breakdown``, ``run_dir``, ...).
    Raises ``InputError`` for a plan refused before launch."""
    hostfile = extra.pop("hostfile", None)
    cfg = make_config(model, dp, tp, pp, steps=steps, microbatches=microbatches, schedule=schedule,
                      global_batch=global_batch, seed=seed, checkpoint_dir=checkpoint_dir,
                      telemetry_path=telemetry_path, **extra)
    return run_config(cfg, timeout_s=timeout_s, hostfile=hostfile)
