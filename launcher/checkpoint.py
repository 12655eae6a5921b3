"""Checkpoints with ``torch.distributed.checkpoint`` (DCP): sharded save, resharding load.

Layout under the checkpoint directory::

    step_00000010/          a completed checkpoint (DCP shards + .metadata + meta.json)
    .tmp-step_00000012/     a save in progress (ignored by readers; removed on retry)

A save writes every rank's shards into the temporary directory, waits for all ranks,
then rank 0 writes ``meta.json`` and renames the directory to its final name (an atomic
rename on one file system): a crash mid-save leaves the previous checkpoint usable.
Checkpoints hold the model and Adam state keyed by fully-qualified parameter names,
which are identical across plans, so loading into another (dp, tp, pp) layout reshards:
each rank reads exactly the slices of the keys it holds. ``meta.json`` holds the step
count (which is also the data position: batches are a function of seed and step), the
run's identity (model, seed, global batch) and rank 0's torch RNG state.

Multi-host runs need the checkpoint directory on a file system shared by all hosts.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable

CKPT_RE = re.compile(r"^step_(\d+)$")
META = "meta.json"
IDENTITY_KEYS = ("model", "seed", "global_batch")


def ckpt_name(step: int) -> str:
    return f"step_{step:08d}"


def latest_checkpoint(directory: str | os.PathLike | None) -> tuple[int, Path] | None:
    """The completed checkpoint with the highest step, or None."""
    if directory is None or not Path(directory).is_dir():
        return None
    best = None
    for p in Path(directory).iterdir():
        m = CKPT_RE.match(p.name)
        if m and (p / META).is_file():
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, p)
    return best


def read_meta(path: str | os.PathLike) -> dict:
    return json.loads((Path(path) / META).read_text())


def _state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    # param_groups name the parameters a rank holds, which differ across plans; the
    # hyper-parameters come from the run's config, so only per-parameter state is stored.
    return msd, osd


def save(directory: str | os.PathLike, step: int, model, optimizer, meta: dict, *, rank: int,
         barrier, keep: int, commit: Callable[[], bool] | None = None) -> Path | None:
    """Collective: every rank calls it. Returns the final checkpoint path; None on rank 0
    when ``commit`` (asked there just before the rename) said no: nothing is saved (a
    launch a newer one replaced while it saved, ``launcher.worker``)."""
    import torch
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    final = directory / ckpt_name(step)
    tmp = directory / f".tmp-{ckpt_name(step)}"
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)              # left over from a crashed save
    barrier()
    msd, osd = _state(model, optimizer)
    dcp.save({"model": msd, "optim": {"state": osd["state"]}}, checkpoint_id=str(tmp))
    barrier()
    committed: Path | None = final
    if rank == 0 and commit is not None and not commit():
        shutil.rmtree(tmp, ignore_errors=True)
        committed = None
    elif rank == 0:
        rng = base64.b64encode(torch.random.get_rng_state().numpy().tobytes()).decode()
        (tmp / META).write_text(json.dumps({**meta, "step": step, "torch_rng_state": rng}))
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(directory)
        _prune(directory, keep)
    barrier()
    return committed


def load(path: str | os.PathLike, model, optimizer, expect: dict) -> dict:
    """Collective: load ``path`` into this rank's (possibly differently sharded) model and
    optimizer. ``expect`` holds the identity the checkpoint must match."""
    import numpy as np
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from instances.errors import InputError

    meta = read_meta(path)
    for k in IDENTITY_KEYS:
        if meta.get(k) != expect.get(k):
            raise InputError(f"checkpoint was written with {k}={meta.get(k)!r}, this run has "
                             f"{expect.get(k)!r}", file=str(Path(path) / META), field=k)
    msd, osd = _state(model, optimizer)
    state = {"model": msd, "optim": {"state": osd["state"]}}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict={"state": state["optim"]["state"], "param_groups": osd["param_groups"]})
    rng = np.frombuffer(base64.b64decode(meta["torch_rng_state"]), dtype=np.uint8).copy()
    torch.random.set_rng_state(torch.from_numpy(rng))
    return meta


def _prune(directory: Path, keep: int) -> None:
    done = sorted((int(m.group(1)), p) for p in directory.iterdir()
                  if (m := CKPT_RE.match(p.name)) and (p / META).is_file())
    for _, p in done[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
