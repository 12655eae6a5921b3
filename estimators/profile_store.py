"""The profile store: measured layer and collective costs on disk, reused across jobs.

Directory (default ``$ARENA_PROFILE_DIR`` or ``~/.cache/arena/profiles``)::

    layers/<device>/<dtype>.json     {"schema_version", "device", "dtype", "entries": {key: record}}
    collectives/<device>.json        {"schema_version", "device", "entries": [record, ...]}
    steps/<device>.json              {"schema_version", "device", "entries": {dtype: optimizer step cost}}
    measured_runs.jsonl              one measured training run per line (the launcher's telemetry
                                     appends plain records; validated here when read)

A layer record is keyed by (kind, signature, tp, micro_batch): every model whose layer
has the same signature (instances.models.LayerSpec.signature) reuses it. Files carry
``schema_version``; a file of another version is refused with an error naming it.
Writes go to a temporary file that is renamed over the old one (no torn files).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from instances.errors import InputError
from instances.structured import loads_json
from launcher.telemetry import BREAKDOWN_KEYS, MEASURED_RUNS_FILE, RECORD_KEYS, store_dir

SCHEMA_VERSION = 1
# The measured-run schema is the launcher's (its telemetry writes plain JSON lines); the
# store validates each record when it reads them (``validate_measured_run``).
MEASURED_RUN_KEYS = RECORD_KEYS
OPTIONAL_RUN_KEYS = BREAKDOWN_KEYS + ("link_load",)   # link_load: other jobs' load on shared links (learned.py)


def default_root() -> Path:
    """``$ARENA_PROFILE_DIR``, else ``~/.cache/arena/profiles`` (the launcher's telemetry store)."""
    return store_dir()


def validate_measured_run(rec, *, file: str | None = None, line: int | None = None) -> dict:
    """``rec`` if it is a measured run of the launcher's schema (``launcher.telemetry``):
    every key of ``MEASURED_RUN_KEYS``, ``kind`` "measured_run", a positive finite
    ``iteration_time_s``, positive integer degrees and, when present, a ``link_load`` >= 0
    and one breakdown entry per pipeline stage; otherwise ``InputError`` naming the file, line and field."""
    if not isinstance(rec, dict) or rec.get("kind") != "measured_run":
        raise InputError("expected an object with kind 'measured_run'", file=file, line=line, field="kind")
    missing = [k for k in MEASURED_RUN_KEYS if k not in rec]
    if missing:
        raise InputError(f"measured run lacks {', '.join(missing)}", file=file, line=line, field=missing[0])
    t = rec["iteration_time_s"]
    if isinstance(t, bool) or not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
        raise InputError(f"must be a positive number, got {t!r}", file=file, line=line, field="iteration_time_s")
    for k in ("dp", "tp", "pp", "microbatches", "global_batch"):
        v = rec[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"must be a positive integer, got {v!r}", file=file, line=line, field=k)
    load = rec.get("link_load", 0.0)
    if isinstance(load, bool) or not (isinstance(load, (int, float)) and math.isfinite(load) and load >= 0):
        raise InputError(f"must be a number >= 0, got {load!r}", file=file, line=line, field="link_load")
    for k in BREAKDOWN_KEYS:
        if k in rec and (not isinstance(rec[k], list) or len(rec[k]) != rec["pp"]):
            raise InputError(f"must be a list of one number per pipeline stage (pp={rec['pp']}), got {rec[k]!r}",
                             file=file, line=line, field=k)
    return rec


@dataclass(frozen=True)
class LayerProfile:
    """One layer kind measured on one device.

    ``measured_*``: what ran (the reduced shape and its FLOPs from the model catalog);
    ``fwd_s``/``bwd_s``: the full-size layer's time at this micro-batch and tp, scaled from
    the measurement by the FLOP ratio (``scale`` says so; 1.0 = measured at full size),
    timed after writing ``flush_bytes`` of other data (a cold cache); ``warm_*``: the same,
    repeated at once (the layer's data in cache); ``param_bytes`` and ``saved_bytes``: the
    measured shape's working set (parameters — gradients as many —, and what autograd
    saved for backward plus the input). Records written before these existed lack them
    (None)."""
    device: str
    dtype: str
    kind: str
    signature: tuple
    tp: int
    micro_batch: int
    fwd_s: float
    bwd_s: float
    fwd_flops_per_s: float
    bwd_flops_per_s: float
    measured_shape: str
    measured_fwd_s: float
    measured_bwd_s: float
    scale: float
    repeats: int
    device_seconds: float
    warm_fwd_s: float | None = None
    warm_bwd_s: float | None = None
    param_bytes: float | None = None
    saved_bytes: float | None = None
    flush_bytes: float = 0.0

    def key(self) -> str:
        return json.dumps([self.kind, list(self.signature), self.tp, self.micro_batch])


@dataclass(frozen=True)
class CollectiveProfile:
    device: str
    backend: str
    op: str                    # all_reduce, all_gather, reduce_scatter, send_recv
    group_size: int
    message_bytes: int
    time_s: float
    repeats: int
    device_seconds: float


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    raw = loads_json(path.read_bytes(), file=str(path))
    if not isinstance(raw, dict):
        raise InputError("expected a JSON object", file=str(path))
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"unsupported schema_version {raw.get('schema_version')!r} (this version reads "
                         f"{SCHEMA_VERSION}); re-run `arena profile`", file=str(path), field="schema_version")
    return raw


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


class ProfileStore:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_root()

    # -- layers ----------------------------------------------------------------------
    def _layer_path(self, device: str, dtype: str) -> Path:
        return self.root / "layers" / device / f"{dtype}.json"

    def _load_layers(self, device: str, dtype: str) -> dict[str, LayerProfile]:
        path = self._layer_path(device, dtype)
        if not path.exists():
            return {}
        raw = _read_json(path)
        out = {}
        for key, rec in raw.get("entries", {}).items():
            try:
                rec = dict(rec)
                rec["signature"] = _tuplify(rec["signature"])
                out[key] = LayerProfile(**rec)
            except TypeError as e:
                raise InputError(f"bad layer record: {e}", file=str(path), field=f"entries[{key}]") from None
        return out

    def put_layers(self, records: list[LayerProfile]) -> None:
        by_file: dict[tuple[str, str], list[LayerProfile]] = {}
        for r in records:
            by_file.setdefault((r.device, r.dtype), []).append(r)
        for (device, dtype), recs in by_file.items():
            entries = self._load_layers(device, dtype)
            for r in recs:
                entries[r.key()] = r
            doc = {"schema_version": SCHEMA_VERSION, "device": device, "dtype": dtype,
                   "entries": {k: asdict(v) for k, v in sorted(entries.items())}}
            _atomic_write(self._layer_path(device, dtype), json.dumps(doc, indent=1))

    def get_layer(self, device: str, dtype: str, kind: str, signature: tuple, tp: int,
                  micro_batch: int) -> LayerProfile | None:
        key = json.dumps([kind, list(signature), tp, micro_batch])
        return self._load_layers(device, dtype).get(key)

    def layer_records(self, device: str | None = None) -> list[LayerProfile]:
        base = self.root / "layers"
        if not base.exists():
            return []
        out = []
        for ddir in sorted(base.iterdir()):
            if device is not None and ddir.name != device:
                continue
            for f in sorted(ddir.glob("*.json")):
                out.extend(self._load_layers(ddir.name, f.stem).values())
        return out

    def devices(self) -> list[str]:
        base = self.root / "layers"
        return sorted(d.name for d in base.iterdir()) if base.exists() else []

    # -- collectives -----------------------------------------------------------------
    def collectives_path(self, device: str) -> Path:
        """The file that holds ``device``'s collective records (``put_collectives``)."""
        return self.root / "collectives" / f"{device}.json"

    def put_collectives(self, records: list[CollectiveProfile]) -> None:
        by_dev: dict[str, list[CollectiveProfile]] = {}
        for r in records:
            by_dev.setdefault(r.device, []).append(r)
        for device, recs in by_dev.items():
            old = {(r.op, r.group_size, r.message_bytes, r.backend): r for r in self.collective_records(device)}
            for r in recs:
                old[(r.op, r.group_size, r.message_bytes, r.backend)] = r
            doc = {"schema_version": SCHEMA_VERSION, "device": device,
                   "entries": [asdict(v) for _, v in sorted(old.items())]}
            _atomic_write(self.collectives_path(device), json.dumps(doc, indent=1))

    def collective_records(self, device: str) -> list[CollectiveProfile]:
        path = self.collectives_path(device)
        if not path.exists():
            return []
        raw = _read_json(path)
        out = []
        for i, rec in enumerate(raw.get("entries", [])):
            try:
                out.append(CollectiveProfile(**rec))
            except TypeError as e:
                raise InputError(f"bad collective record: {e}", file=str(path), field=f"entries[{i}]") from None
        return out

    # -- optimizer step ----------------------------------------------------------------
    def _step_path(self, device: str) -> Path:
        return self.root / "steps" / f"{device}.json"

    def put_step(self, device: str, dtype: str, *, seconds_per_param: float, params: int, seconds: float) -> None:
        """Measured optimizer step (Adam step + zero_grad) cost on ``device``."""
        path = self._step_path(device)
        doc = _read_json(path) if path.exists() else {"schema_version": SCHEMA_VERSION, "device": device,
                                                      "entries": {}}
        doc["entries"][dtype] = {"seconds_per_param": seconds_per_param, "params": params, "seconds": seconds}
        _atomic_write(path, json.dumps(doc, indent=1))

    def steps(self, device: str) -> dict:
        path = self._step_path(device)
        return _read_json(path).get("entries", {}) if path.exists() else {}

    # -- measured runs (the launcher's telemetry appends them as plain JSON lines) -----
    @property
    def runs_path(self) -> Path:
        return self.root / MEASURED_RUNS_FILE

    def read_measured_runs(self) -> list[dict]:
        """Every measured run of the store, each validated (``validate_measured_run``); a
        bad line is an ``InputError`` naming the file and line."""
        path = self.runs_path
        if not path.exists():
            return []
        out = []
        with path.open() as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rec = loads_json(line, file=str(path))
                except InputError as e:
                    raise InputError(e.reason, file=str(path), line=line_no) from None
                out.append(validate_measured_run(rec, file=str(path), line=line_no))
        return out

    # -- timers for the analytic model ------------------------------------------------
    def timers(self, eff, device: str | None = None):
        """(ProfiledTimer, ProfiledComm) from this store's records of ``device`` (the only
        profiled device when None); layers and links not in the store fall back to the
        catalog roofline."""
        from .timing import CatalogComm, ProfiledComm, ProfiledTimer, RooflineTimer
        roof = RooflineTimer(eff)
        devices = self.devices()
        if device is None:
            if not devices:
                return roof, CatalogComm(eff)
            if len(devices) > 1:
                raise InputError(f"profile store holds several devices {devices}; name one", field="profile_device")
            device = devices[0]
        rates: dict = {}
        for r in self.layer_records(device):
            key = (r.kind, r.signature, r.dtype, r.tp)
            # keep the largest micro-batch's rate (closest to training micro-batches)
            if key not in rates or r.micro_batch > rates[key][0]:
                rates[key] = (r.micro_batch, (r.fwd_flops_per_s, r.bwd_flops_per_s))
        steps = self.steps(device)
        timer = ProfiledTimer(device, {k: v[1] for k, v in rates.items()}, roof,
                              step_s_per_param={d: e["seconds_per_param"] for d, e in steps.items()})
        records = self.collective_records(device)
        comm = ProfiledComm(eff, device=device, fit=fit_collectives(records), tables=collective_tables(records))
        return timer, comm


def collective_tables(records: list[CollectiveProfile]) -> dict:
    """(op, group size) -> measured (message bytes, seconds) sorted by size, made
    non-decreasing in size (a running maximum: a larger message never takes less time;
    small-message timings on a shared host are noisy)."""
    by: dict = {}
    for r in records:
        by.setdefault((r.op, r.group_size), {})[r.message_bytes] = r.time_s
    out = {}
    for key, pts in by.items():
        rows, top = [], 0.0
        for b in sorted(pts):
            top = max(top, pts[b])
            rows.append((float(b), top))
        out[key] = tuple(rows)
    return out


def fit_collectives(records: list[CollectiveProfile]) -> dict:
    """Latency + bandwidth of the measured links by least squares on the all-reduce and
    send/recv records: all-reduce t = 2(n-1) a + 2(n-1)/n * bytes / B; send t = a + bytes / B."""
    import numpy as np
    rows, ys = [], []
    for r in records:
        n = r.group_size
        if r.op == "all_reduce" and n > 1:
            rows.append((2 * (n - 1), 2 * (n - 1) / n * r.message_bytes))
        elif r.op == "send_recv":
            rows.append((1.0, float(r.message_bytes)))
        else:
            continue
        ys.append(r.time_s)
    if len(rows) < 2:
        return {}
    A, y = np.array(rows), np.array(ys)
    # relative least squares (weight 1/t) so small messages count
    w = 1.0 / y
    sol, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    lat, inv_bw = max(float(sol[0]), 0.0), float(sol[1])
    if not inv_bw > 0:
        return {}
    return {"intra": (lat, 1.0 / inv_bw)}
