"""Python API: train a catalog model with a given plan under mpiexec and return what it
measured (used by the estimators' calibration and by the tests)."""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .config import OptimizerConfig, ParallelPlan, TrainConfig
from .launch import kill_job, ranks_not_done, read_events, read_results, start, tail
from .validate import validate

STOP_GRACE_S = 10.0          # after the timeout: SIGTERM (checkpoint + exit), then SIGKILL


@dataclass(frozen=True)
class TrainResult:
    steps: tuple[int, ...]                  # 1-based step numbers trained by this launch
    losses: tuple[float, ...]               # loss per step (mean over the global batch)
    iteration_times_s: tuple[float, ...]    # wall time per step, measured on rank 0
    wall_time_s: float                      # launch to exit, including start-up
    returncode: int                         # mpiexec's exit status (124: timed out)
    start_step: int                         # the step resumed from (0: fresh start)
    run_dir: str
    events: tuple[dict, ...] = ()
    output_tail: str = ""                   # end of the ranks' stderr (failed: + exit status, stdout)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def make_config(model: str, dp: int, tp: int, pp: int, *, steps: int, microbatches: int = 1,
                schedule: str = "1f1b", global_batch: int | None = None, seed: int = 0,
                checkpoint_dir=None, telemetry_path=None, telemetry_store=None, run_dir=None,
                **extra) -> TrainConfig:
    run_dir = str(run_dir) if run_dir else tempfile.mkdtemp(prefix="arena-train-")
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


def run_config(cfg: TrainConfig, *, timeout_s: float = 120, hostfile: str | None = None,
               echo: bool = False, device_type: str = "cpu") -> TrainResult:
    """Validate, launch, wait (SIGTERM at the timeout, SIGKILL after a grace period)."""
    validate(cfg, device_type=device_type)
    t0 = time.perf_counter()
    proc = start(cfg, hostfile, echo=echo)
    try:
        rc = proc.wait(timeout=timeout_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        _stop(proc, cfg.run_dir)        # ranks checkpoint (if a directory is set) and exit
        if isinstance(exc, KeyboardInterrupt):
            raise
        rc = 124
    wall = time.perf_counter() - t0
    results = read_results(cfg.run_dir)
    first = results[0]["step"] - 1 if results else 0
    return TrainResult(steps=tuple(r["step"] for r in results),
                       losses=tuple(r["loss"] for r in results),
                       iteration_times_s=tuple(r["iteration_time_s"] for r in results),
                       wall_time_s=wall, returncode=rc, start_step=first, run_dir=str(cfg.run_dir),
                       events=tuple(read_events(cfg.run_dir)),
                       output_tail=_output_tail(cfg.run_dir, rc))


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
