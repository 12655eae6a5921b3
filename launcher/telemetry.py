"""Telemetry of launched jobs: measured runs for the estimators' profile store, a per-run
telemetry file, and a progress file the engine polls while a job runs.

Measured-run records are plain JSON objects, one per line, appended to
``<store>/measured_runs.jsonl`` (and to ``--telemetry FILE``). This module is the
schema's one definition; the launcher imports nothing from the estimators, and the
estimators' profile store validates each record when it reads the file
(``estimators.profile_store.validate_measured_run``). Keys (``RECORD_KEYS``, all
required)::

    kind             "measured_run"
    model            catalog model name
    device           device description (torch.cuda.get_device_name, or "cpu")
    gpu_type         catalog GPU type name
    dtype            dtype that trained ("float32": the launcher trains in float32)
    dp, tp, pp       parallel degrees (positive integers)
    microbatches     micro-batches per step; schedule  "gpipe" or "1f1b"
    global_batch     samples per step
    num_nodes, gpus_per_node
    iteration_time_s measured seconds of this step (> 0)
    step             step index; timestamp  seconds since the epoch

and with ``--breakdown`` (``BREAKDOWN_KEYS``): ``stage_compute_s``, ``stage_comm_s``,
lists with one entry per pipeline stage.

The store directory is, in order: the explicit ``telemetry_store``, ``$ARENA_PROFILE_DIR``,
``~/.cache/arena/profiles``. The first step of every launch (warm-up: allocator, lazy
initialisation, pipeline shape inference) is written to the per-run telemetry file but not
to the store.

The progress file is a small JSON object replaced atomically (write + rename), so a
reader never sees a half-written file.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

STORE_ENV = "ARENA_PROFILE_DIR"
DEFAULT_STORE = Path("~/.cache/arena/profiles")
MEASURED_RUNS_FILE = "measured_runs.jsonl"
RECORD_KEYS = ("kind", "model", "device", "gpu_type", "dtype", "dp", "tp", "pp", "microbatches",
               "schedule", "global_batch", "num_nodes", "gpus_per_node", "iteration_time_s", "step",
               "timestamp")
BREAKDOWN_KEYS = ("stage_compute_s", "stage_comm_s")
NONFINITE = "nonfinite"         # stopped at a non-finite loss or state (launcher/worker.py); the reason is given
STATUSES = ("starting", "running", "stopped", "finished", "failed", NONFINITE)


def store_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get(STORE_ENV)
    return Path(env) if env else DEFAULT_STORE.expanduser()


def measured_run(cfg, *, device: str, gpu_type: str, iteration_time_s: float, step: int,
                 stage_compute_s: list[float] | None = None,
                 stage_comm_s: list[float] | None = None) -> dict:
    """One measured-run record of a step of ``cfg`` (a ``TrainConfig``)."""
    p = cfg.plan
    rec = {"kind": "measured_run", "model": cfg.model, "device": device, "gpu_type": gpu_type,
           "dtype": "float32", "dp": p.dp, "tp": p.tp, "pp": p.pp, "microbatches": p.microbatches,
           "schedule": p.schedule, "global_batch": cfg.global_batch, "num_nodes": cfg.num_nodes,
           "gpus_per_node": cfg.gpus_per_node, "iteration_time_s": float(iteration_time_s),
           "step": int(step), "timestamp": time.time()}
    if stage_compute_s is not None:
        rec["stage_compute_s"] = [float(v) for v in stage_compute_s]
        rec["stage_comm_s"] = [float(v) for v in stage_comm_s]
    return rec


def append_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    """Append records as JSON lines with one ``write`` (O_APPEND), so concurrent writers
    do not interleave within a line."""
    if not records:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def append_measured_runs(store: str | os.PathLike, records: list[dict]) -> None:
    """Append measured-run records (the schema above) to the store's ``MEASURED_RUNS_FILE``
    as plain JSON lines; the profile store validates them when it reads."""
    append_jsonl(Path(store) / MEASURED_RUNS_FILE, records)


def write_progress(path: str | os.PathLike, **fields) -> None:
    """Replace the progress file atomically. Fields: status (one of STATUSES),
    iterations_done, steps_total, last_checkpoint_step, iteration_time_s, ..."""
    if fields.get("status") not in STATUSES:
        raise ValueError(f"progress status must be one of {STATUSES}, got {fields.get('status')!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**fields, "updated_at": time.time()}))
    os.replace(tmp, path)


def read_progress(path: str | os.PathLike) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class ComputeTimer:
    """Per-step compute time of one rank's stage module, from module hooks: forward
    (pre-hook to hook), backward (from the gradient reaching the module's output to the
    last parameter gradient accumulated) and the optimizer step (timed by the caller).
    With ``--breakdown`` every step starts at a barrier; a stage's compute is the largest over
    its ranks, and its communication is the iteration time minus that compute: pipeline
    send/receive waits and bubbles, data-parallel gradient reduction, the per-step loss
    all-reduce. Tensor-parallel collectives run inside the layers and count as compute."""

    def __init__(self, module):
        import warnings

        # stage 0's input is token ids: the backward pre-hook fires on output gradients, as wanted
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients")
        self.compute_s = 0.0
        self._bwd_start: float | None = None
        self._bwd_end: float | None = None
        self._fwd_start = 0.0
        module.register_forward_pre_hook(self._fwd_pre)
        module.register_forward_hook(self._fwd_post)
        module.register_full_backward_pre_hook(self._bwd_pre)
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._grad_done)

    def _close_backward(self):
        if self._bwd_start is not None and self._bwd_end is not None:
            self.compute_s += self._bwd_end - self._bwd_start
        self._bwd_start = self._bwd_end = None

    def _fwd_pre(self, *_):
        self._close_backward()
        self._fwd_start = time.perf_counter()

    def _fwd_post(self, *_):
        self.compute_s += time.perf_counter() - self._fwd_start

    def _bwd_pre(self, *_):
        self._close_backward()
        self._bwd_start = time.perf_counter()

    def _grad_done(self, *_):
        self._bwd_end = time.perf_counter()

    def take(self) -> float:
        """Compute seconds since the last call (closing an open backward interval)."""
        self._close_backward()
        out, self.compute_s = self.compute_s, 0.0
        return out
