"""What a move of a running job costs, in seconds of the job's GPUs standing still: a
model of the parts the launcher measures on every move (``launcher.move_record``),
calibrated from those measurements, with published defaults for GPU clusters.

    downtime = drain_s (+ stop_s through storage) + state movement + start-up + warmup_s
    state movement = fixed + bytes_moved / bytes_per_s        (per path)
    start-up = startup_s   when fresh processes start (a storage relaunch, or growing:
                           the joining processes; their start overlaps the drain, the
                           model charges it whole: an upper bound)
             = regroup_s   when only the running processes re-form their groups and
                           rebuild the model (a d2d move that does not grow)

The downtime is what the move costs the job: from the request to the end of the first
step on the new plan, minus that step's steady part (it trained). Fields beyond the five
named in issue 12 (``drain_s, startup_s, warmup_s, d2d_bytes_per_s,
storage_bytes_per_s``), because the measurements need them: ``stop_s`` (the storage path
also ends its processes: 0.4-0.6 s here), ``regroup_s`` (a d2d move of running ranks
starts no process: 0.02-0.15 s here against 6-11 s for a relaunch) and the per-path fixed
state costs ``d2d_fixed_s`` / ``storage_fixed_s`` (building the state dicts, DCP
metadata, the ranks' agreement: for small models these, not bandwidth, are the state
movement time).

``fit(records)`` calibrates from move records (medians for the constant parts, the
drain including the record's unattributed ``other_s``; a
least-squares line through (bytes, seconds) per path for state movement, whose slope
is the bandwidth — when the bytes do not explain the seconds (slope <= 0) the path keeps
the prior's bandwidth and the fixed part is the median). ``held_out(records)`` fits on
some repetitions and reports the error per (path, kind) on the others.
``MoveCostParams.gpu_cluster_defaults()`` are the published figures (docs/launcher.md
cites them); ``MoveCostParams.measured_here()`` loads the calibration measured on this
project's machine (``instances/data/launcher/move_cost_measured.json``, written by
``bench/bench_moves.py``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, fields
from typing import Iterable, Sequence

from instances.errors import InputError
from instances.structured import loads_json
from launcher.reshard_plan import changed_owner_bytes, uses_fsdp

MEASURED_FILE = "data/launcher/move_cost_measured.json"
PATHS = ("d2d", "storage")


@dataclass(frozen=True)
class MoveCostParams:
    drain_s: float                 # move requested -> every rank stopped at a step boundary
    startup_s: float               # fresh processes + communicators up (import, CUDA/NCCL, model build)
    regroup_s: float               # running processes re-form their groups and rebuild the model
    warmup_s: float                # the first steps' excess over the steady iteration time
    d2d_bytes_per_s: float         # device-to-device state movement bandwidth (whole job)
    storage_bytes_per_s: float     # checkpoint write + read bandwidth (whole job)
    stop_s: float = 0.0            # through storage: the processes exiting, after the drain
    d2d_fixed_s: float = 0.0       # per-move fixed part of a d2d state movement
    storage_fixed_s: float = 0.0   # per-move fixed part of a save + load

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            ok = isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
            if not ok or (f.name.endswith("bytes_per_s") and v <= 0):
                raise InputError(f"must be a finite number {'> 0' if 'bytes' in f.name else '>= 0'}, got {v!r}",
                                 field=f.name)

    # --- defaults and the measured calibration -------------------------------------------
    @classmethod
    def gpu_cluster_defaults(cls) -> "MoveCostParams":
        """Published figures for GPU clusters (sources in docs/launcher.md, "Move cost"):
        storage at 100 MB/s (the issue's NAS: 8-13 s per GB), device to device at 25 GB/s
        (one InfiniBand HDR 200 Gb/s link; NVLink 4 within a node measures ~380 GB/s, so
        this is the cross-node case), fresh processes + NCCL communicators 20 s, regroup of
        running processes 1 s (ElasWave: in-place communicator recovery within a second),
        drain 1 s (at most one iteration, job-dependent), stop 1 s and warm-up 2 s
        (assumptions: we found no published figure)."""
        return cls(drain_s=1.0, startup_s=20.0, regroup_s=1.0, warmup_s=2.0, d2d_bytes_per_s=25e9,
                   storage_bytes_per_s=1e8, stop_s=1.0)

    @classmethod
    def from_json(cls, d: dict, *, file: str | None = None) -> "MoveCostParams":
        if not isinstance(d, dict):
            raise InputError("must be an object", file=file, field="params")
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InputError(f"unknown keys {sorted(unknown)}", file=file, field="params")
        try:
            return cls(**d)
        except TypeError as e:
            raise InputError(str(e), file=file, field="params") from None
        except InputError as e:
            raise InputError(e.reason, file=file, field=e.field) from None

    @classmethod
    def measured_here(cls) -> "MoveCostParams":
        """The calibration measured on this project's machine (provenance in the file)."""
        return cls.from_json(load_measured()["params"], file=f"instances/{MEASURED_FILE}")

    def to_json(self) -> dict:
        return asdict(self)

    # --- prediction -------------------------------------------------------------------------
    def predict(self, *, path: str, bytes_moved: float, new_processes: bool) -> dict:
        """Seconds per part and the downtime of one move."""
        if path not in PATHS:
            raise InputError(f"must be one of {', '.join(PATHS)}, got {path!r}", field="path")
        if path == "d2d":
            state = self.d2d_fixed_s + bytes_moved / self.d2d_bytes_per_s
        else:
            state = self.storage_fixed_s + bytes_moved / self.storage_bytes_per_s
        start = self.startup_s if (new_processes or path == "storage") else self.regroup_s
        drain = self.drain_s + (self.stop_s if path == "storage" else 0.0)
        parts = {"drain_stop_s": drain, "state_s": state, "startup_s": start, "warmup_s": self.warmup_s}
        return {**parts, "downtime_s": sum(parts.values())}

    def predict_record(self, rec: dict) -> dict:
        """The prediction for a measured move record (its path, bytes and world sizes)."""
        return self.predict(path=_path(rec), bytes_moved=float(rec["bytes_moved"]),
                            new_processes=_path(rec) == "storage" or rec["world_new"] > rec["world_old"])

    def move_seconds(self, state_bytes: float, old: tuple[int, int, int], new: tuple[int, int, int], *,
                     path: str = "d2d", kept_ranks: int | None = None) -> float:
        """Downtime (s) of a move of a job with ``state_bytes`` of training state (one copy) costs,
        from layout ``old`` to ``new`` (dp, tp, pp). d2d: the bytes that change owner
        (``launcher.reshard_plan.changed_owner_bytes``, uniform-layers approximation; the
        first ``kept_ranks`` positions stay, default all the two layouts share); storage:
        one copy written + what the new ranks read (a full copy per data-parallel replica
        under DDP, one copy otherwise)."""
        n_old, n_new = _world(old), _world(new)
        kept = min(n_old, n_new) if kept_ranks is None else kept_ranks
        if path == "d2d":
            moved = changed_owner_bytes(state_bytes, old, new, kept)
        else:
            replicas = new[0] if new[0] > 1 and not uses_fsdp(new) else 1
            moved = state_bytes * (1 + replicas)
        return self.predict(path=path, bytes_moved=moved, new_processes=n_new > n_old)["downtime_s"]


def _world(p) -> int:
    return p[0] * p[1] * p[2]


def _path(rec: dict) -> str:
    return "d2d" if rec["path"] == "d2d" else "storage"


def downtime(rec: dict) -> float | None:
    """A record's downtime (``move_record``): total minus the first step's steady part."""
    if rec.get("downtime_s") is not None:
        return rec["downtime_s"]
    if rec.get("total_s") is None or rec.get("warmup_s") is None or rec.get("first_step_s") is None:
        return None
    return rec["total_s"] - rec["first_step_s"] + rec["warmup_s"]


def _complete(records: Iterable[dict]) -> list[dict]:
    return [r for r in records if downtime(r) is not None and r.get("startup_s") is not None]


def _median(xs: Sequence[float], default: float) -> float:
    return statistics.median(xs) if xs else default


def _line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) through (x, y), None when x does not vary."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def fit(records: Iterable[dict], prior: MoveCostParams | None = None) -> MoveCostParams:
    """Calibrate from measured move records (``MpiExecutor.move_records``); parts no record
    informs keep ``prior`` (default: ``gpu_cluster_defaults``)."""
    prior = prior or MoveCostParams.gpu_cluster_defaults()
    recs = _complete(records)
    if not recs:
        raise InputError("no complete move record to fit (each needs its downtime: total, first step, "
                         "warm-up)", field="records")
    fresh = [r["startup_s"] for r in recs if _path(r) == "storage" or r["world_new"] > r["world_old"]]
    regroup = [r["startup_s"] for r in recs if _path(r) == "d2d" and r["world_new"] <= r["world_old"]]
    warm = [r["warmup_s"] for r in recs]

    def drain(path):
        return [r["drain_stop_s"] + (r.get("other_s") or 0.0) for r in recs if _path(r) == path]
    d2d_drain = _median(drain("d2d"), prior.drain_s)
    storage_drain = _median(drain("storage"), d2d_drain + prior.stop_s)
    if not drain("d2d"):                  # only storage moves: their drain, the prior's stop in it
        d2d_drain = max(0.0, storage_drain - prior.stop_s)
    out = {"drain_s": d2d_drain, "stop_s": max(0.0, storage_drain - d2d_drain),
           "startup_s": _median(fresh, prior.startup_s), "regroup_s": _median(regroup, prior.regroup_s),
           "warmup_s": _median(warm, prior.warmup_s)}
    for path in PATHS:
        pts = [(float(r["bytes_moved"]), r["state_s"]) for r in recs if _path(r) == path]
        line = _line(pts)
        bw = getattr(prior, f"{path}_bytes_per_s")
        if line is not None and line[1] > 0:
            fixed, bw = max(0.0, line[0]), 1.0 / line[1]
        else:
            fixed = max(0.0, _median([s - b / bw for b, s in pts], getattr(prior, f"{path}_fixed_s")))
        out[f"{path}_bytes_per_s"], out[f"{path}_fixed_s"] = bw, fixed
    return MoveCostParams(**out)


def held_out(records: Sequence[dict], is_test=None, prior: MoveCostParams | None = None) -> dict:
    """Fit on the records ``is_test`` rejects, predict the others; per (path, kind) the
    count, mean absolute error of the downtime (s), mean relative error and mean measured
    downtime. Default split: every second repetition of each (model, path, kind) is held out
    (records carry ``rep``; without it, their order)."""
    recs = _complete(records)
    if is_test is None:
        seen: dict[tuple, int] = {}

        def is_test(r):
            key = (r.get("model"), _path(r), r["kind"])
            seen[key] = seen.get(key, 0) + 1
            return (r.get("rep", seen[key] - 1)) % 2 == 1
    flags = [bool(is_test(r)) for r in recs]
    train = [r for r, t in zip(recs, flags) if not t]
    test = [r for r, t in zip(recs, flags) if t]
    if not train or not test:
        raise InputError("the split leaves no record to fit or none to test", field="records")
    params = fit(train, prior)
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in test:
        groups.setdefault(f"{_path(r)} {r['kind']}", []).append((params.predict_record(r)["downtime_s"],
                                                                  downtime(r)))
    per_kind = {k: {"n": len(v), "mean_abs_error_s": statistics.fmean(abs(p - m) for p, m in v),
                    "mean_rel_error": statistics.fmean(abs(p - m) / m for p, m in v),
                    "mean_measured_s": statistics.fmean(m for _, m in v)}
                for k, v in sorted(groups.items())}
    return {"params": params.to_json(), "fit_records": len(train), "test_records": len(test), "per_kind": per_kind}


def load_measured() -> dict:
    """The measured calibration file: ``{"params": ..., "provenance": ..., "held_out": ...}``."""
    from importlib import resources

    label = f"instances/{MEASURED_FILE}"
    try:
        text = resources.files("instances").joinpath(MEASURED_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found (run bench/bench_moves.py --write-calibration)", file=label) from None
    d = loads_json(text, file=label)
    if not isinstance(d, dict) or "params" not in d or "provenance" not in d:
        raise InputError("needs keys params and provenance", file=label)
    return d
