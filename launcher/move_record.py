"""Per-move telemetry: the parts of every reconfiguration the launcher carries out.

A move record (plain JSON) holds::

    path          "d2d" (device to device), "storage" (checkpoint through storage) or
                  "storage-fallback" (a d2d move that failed or was refused; ``reason``)
    kind          e.g. "dp->tp", "grow x2", "shrink /2" (``move_kind``)
    old, new      [dp, tp, pp]; world_old, world_new; step  (the step the move follows)
    drain_stop_s  move requested -> every rank stopped at a step boundary (storage: and
                  the processes exited; the checkpoint save is not in it)
    state_s       state movement: d2d transfer + install; storage: save + load
    bytes_moved   bytes that changed owner over the move's path: d2d, the bytes sent
                  between ranks; storage, bytes written + bytes read (``bytes_written``,
                  ``bytes_read``)
    startup_s     process + communicator start-up: d2d, joint/new process groups (with
                  the wait for joining processes) + model build on the new plan; storage,
                  relaunch -> ranks ready, without the checkpoint load
    first_step_s  the first step on the new plan; warmup_s  its excess over the median of
                  the next ``WARMUP_STEADY_STEPS`` steps (None until they ran)
    total_s       move requested -> first step on the new plan done (the executor's
                  ``reconfiguration_times_s``)
    other_s       total_s minus the parts and the first step (waits between them, e.g.
                  between a release and the relaunch)
    downtime_s    total_s minus the first step's steady part (first_step_s - warmup_s):
                  the time the move kept the job from training (None until warm-up known)
"""
from __future__ import annotations

import statistics

WARMUP_STEADY_STEPS = 5


def move_kind(old: tuple[int, int, int], new: tuple[int, int, int]) -> str:
    """``"grow x2"`` / ``"shrink /2"`` when the world size changes, else ``"<a>-><b>"``: the
    degree that shrank most and the one that grew most (e.g. (2,2,1) -> (2,1,2): tp->pp)."""
    n_old, n_new = old[0] * old[1] * old[2], new[0] * new[1] * new[2]
    if n_new != n_old:
        r = f"{max(n_new, n_old) / min(n_new, n_old):g}"
        return f"grow x{r}" if n_new > n_old else f"shrink /{r}"
    if tuple(old) == tuple(new):
        return "same"
    names = ("dp", "tp", "pp")
    ratio = [new[i] / old[i] for i in range(3)]
    return f"{names[min(range(3), key=ratio.__getitem__)]}->{names[max(range(3), key=ratio.__getitem__)]}"


def d2d_record(moved: dict, requested_at: float) -> dict:
    """From the ``moved`` event rank 0 writes (``launcher.worker``)."""
    old, new = tuple(moved["old_plan"]), tuple(moved["new_plan"])
    return {"path": "d2d", "kind": move_kind(old, new), "old": list(old), "new": list(new),
            "world_old": moved["world_old"], "world_new": moved["world_new"], "step": moved["step"],
            "requested_at": requested_at, "ready_at": moved["time"],
            "drain_stop_s": moved["drain_s"], "state_s": moved["transfer_s"] + moved["install_s"],
            "bytes_moved": moved["bytes_moved"], "bytes_written": 0, "bytes_read": 0,
            "startup_s": moved["joint_group_s"] + moved["regroup_s"] + moved["build_s"],
            "first_step_s": None, "warmup_s": None, "total_s": None, "other_s": None, "downtime_s": None}


def storage_record(old: tuple, new: tuple, *, requested_at: float, exited_at: float, save: dict | None,
                   path: str = "storage", reason: str | None = None) -> dict:
    """At the relaunch, from the old launch's ``save`` event (the stop's checkpoint); the
    relaunch's parts come with ``add_relaunch``."""
    save_s = save["duration_s"] if save else 0.0
    written = (save.get("bytes") or 0) if save else 0
    rec = {"path": path, "kind": move_kind(old, new), "old": list(old), "new": list(new),
           "world_old": old[0] * old[1] * old[2], "world_new": new[0] * new[1] * new[2],
           "step": save["step"] if save else None, "requested_at": requested_at, "ready_at": None,
           "drain_stop_s": max(0.0, exited_at - requested_at - save_s), "state_s": save_s,
           "bytes_moved": written, "bytes_written": written, "bytes_read": 0,
           "startup_s": None, "first_step_s": None, "warmup_s": None, "total_s": None, "other_s": None,
           "downtime_s": None}
    if reason:
        rec["reason"] = reason
    return rec


def add_relaunch(rec: dict, load: dict | None, ready: dict | None) -> None:
    """The relaunch's ``load`` and ``ready`` events (``ready.init_s``: process start ->
    ready, the load included)."""
    load_s = load["duration_s"] if load else 0.0
    rec["state_s"] += load_s
    rec["bytes_read"] = (load.get("bytes") or 0) if load else 0
    rec["bytes_moved"] = rec["bytes_written"] + rec["bytes_read"]
    rec["startup_s"] = max(0.0, ready["init_s"] - load_s) if ready else 0.0
    rec["ready_at"] = ready["time"] if ready else None
    if load:
        rec["step"] = load["step"]


def finish(rec: dict, results_after: list[dict]) -> bool:
    """Fill first step, total and warm-up from the steps after the move (``results.jsonl``
    records); True once warm-up is known (nothing more to fill)."""
    if not results_after:
        return False
    first = results_after[0]
    if rec["total_s"] is None:
        rec["first_step_s"] = first["iteration_time_s"]
        rec["total_s"] = first["time"] - rec["requested_at"]
        parts = rec["drain_stop_s"] + rec["state_s"] + (rec["startup_s"] or 0.0) + rec["first_step_s"]
        rec["other_s"] = rec["total_s"] - parts
    steady = [r["iteration_time_s"] for r in results_after[1:1 + WARMUP_STEADY_STEPS]]
    if len(steady) == WARMUP_STEADY_STEPS:
        rec["warmup_s"] = max(0.0, first["iteration_time_s"] - statistics.median(steady))
        rec["downtime_s"] = rec["total_s"] - rec["first_step_s"] + rec["warmup_s"]
        return True
    return False
