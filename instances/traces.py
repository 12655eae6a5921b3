"""Job traces: our format, and importers for Arena's and Philly's (Pollux) formats.

``load_trace(path, *, cluster=None, **import_options) -> tuple[Job, ...]`` detects the
format from the file's first line (gzip-compressed files are read transparently):

- ours: first line ``# arena-trace v1``, then a CSV header with the columns
  ``OUR_COLUMNS``; an empty optional field (deadline_s, requested_gpu_type,
  requested_gpus) is None. ``write_trace(jobs, path)`` writes it; the round trip is
  exact (floats are written with ``repr``). Options: none.
- Arena's CSV (``ARENA_COLUMNS``): times are shifted so that the earliest submission is
  at 0. Options (``ArenaImportOptions``): ``iteration_divisor`` (default 1: the trace
  as written; Arena's simulator used 5 — iterations become ``max(1, n // divisor)``) and
  ``deadline_slack_factor`` (default 1; Arena used 5): the deadline becomes
  ``arrival + factor * (deadline - submission)``. The built-in ``arena-*`` instances use
  5 and 5, like the published runs.
- Philly's CSV from the Pollux artifact (``PHILLY_COLUMNS``): see ``PhillyImportOptions``
  for the documented, seeded recipe that turns (arrival, duration, GPU count) records
  into model-training jobs.

Jobs come back in file order (Philly: by arrival). Every malformed input raises
``InputError`` naming the file, the line and the field.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from .cluster import ClusterSpec
from .csv_rows import CsvRows, read_bounded, read_text
from .errors import InputError
from .gpus import canonical_gpu_name, get_gpu
from .jobs import MAX_ITERATIONS, Job
from .limits import check_coefficient, check_time
from .paths import check_regular_file, write_output

OUR_MAGIC = "# arena-trace v1"
OUR_COLUMNS = ("job_id", "model", "global_batch", "num_iterations", "arrival_s", "deadline_s",
               "priority", "tenant", "requested_gpu_type", "requested_gpus")
ARENA_COLUMNS = ("job_id", "submission_time", "num_iteration", "model_name", "deadline",
                 "batch_size", "num_gpu", "gpu_type")
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")


# ------------------------------------------------------------------------------------
# options
# ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArenaImportOptions:
    iteration_divisor: int = 1          # Arena's simulator: 5
    deadline_slack_factor: float = 1.0  # Arena's simulator: 5

    def __post_init__(self):
        if not isinstance(self.iteration_divisor, int) or isinstance(self.iteration_divisor, bool) \
                or self.iteration_divisor < 1:
            raise InputError(f"must be an integer >= 1, got {self.iteration_divisor!r}",
                             field="iteration_divisor")
        check_coefficient(self.deadline_slack_factor, field="deadline_slack_factor", strict_min=True)


@dataclass(frozen=True)
class PhillyImportOptions:
    """The recipe that turns Philly records into model-training jobs (all seeded):

    1. arrival = timestamp - earliest timestamp in the file; records outside
       ``[start_s, end_s)`` are dropped, the rest sorted by arrival (then line), the
       first ``max_jobs`` kept, and arrivals re-based so the window starts at 0;
    2. GPU request = num_gpus rounded up to a power of two, capped at ``max_gpus``;
    3. GPU type drawn uniformly among ``gpu_types`` (default: the cluster's types that
       have at least that many GPUs, else Arena's A100/V100/A40/A10);
    4. (model, global batch) drawn uniformly among the pairs of the measured table
       (``instances.measurements``) that the oracle finds feasible on the most compact
       shape of that many GPUs of that type (if none, the next type is tried);
    5. iterations = max(1, round(duration / oracle iteration time on that shape)), so the
       job runs about as long as the trace's job did on its requested allocation;
    6. tenant = the record's virtual cluster; no deadline; job id ``philly-<line>``.
    """
    seed: int = 0
    max_jobs: int | None = None
    start_s: float = 0.0
    end_s: float | None = None
    max_gpus: int = 16
    gpu_types: tuple[str, ...] | None = None
    oracle: Any = None                  # an Oracle; default instances.oracle.TableOracle()

    def __post_init__(self):
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise InputError(f"must be an integer, got {self.seed!r}", field="seed")
        if self.max_jobs is not None and (not isinstance(self.max_jobs, int) or self.max_jobs < 1):
            raise InputError(f"must be an integer >= 1 or None, got {self.max_jobs!r}", field="max_jobs")
        check_time(self.start_s, field="start_s")
        if self.end_s is not None:
            check_time(self.end_s, field="end_s")
            if not self.end_s > self.start_s:
                raise InputError(f"must be a time after start_s, got {self.end_s!r}", field="end_s")
        if not isinstance(self.max_gpus, int) or self.max_gpus < 1 or self.max_gpus & (self.max_gpus - 1):
            raise InputError(f"must be a power of two >= 1, got {self.max_gpus!r}", field="max_gpus")
        if self.gpu_types is not None:
            types = self.gpu_types
            if isinstance(types, str):      # from the command line: gpu_types=a100,a40
                types = [t.strip() for t in types.split(",")]
                if not all(types):
                    raise InputError(f"must be a comma-separated list of GPU type names, got {self.gpu_types!r}",
                                     field="gpu_types")
            if not isinstance(types, (list, tuple)) or not types:
                raise InputError("must be a non-empty sequence of GPU type names", field="gpu_types")
            try:
                object.__setattr__(self, "gpu_types", tuple(canonical_gpu_name(t) for t in types))
            except InputError as e:
                raise InputError(e.reason, field="gpu_types") from None


def _make_options(cls, options: dict, label: str):
    known = {f.name for f in fields(cls)}
    for k in options:
        if k not in known:
            raise InputError(f"unknown import option {k!r} for this format; known: "
                             f"{', '.join(sorted(known)) or 'none'}",
                             file=label, field=k)
    try:
        return cls(**options)
    except InputError as e:
        raise InputError(e.reason, file=label, field=e.field) from None


# ------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------

def read_trace_text(path: str | Path) -> str:
    """The text of a trace file (gzip detected by its magic bytes); ``InputError`` naming
    the file when it cannot be read, or is a pipe or a device (reading one may never end)."""
    check_regular_file(path, "trace file")
    try:
        return read_text(path, "trace")
    except NotADirectoryError:
        raise InputError("trace file not found (a part of its path is a file, not a folder)", file=str(path)) from None
    except OSError as e:                    # past the cases read_text names (a name too long, an I/O error)
        raise InputError(f"cannot read the trace file: {e.strerror or e}", file=str(path)) from None


def _records(rows: CsvRows, text: str):
    """``rows``' (line, record) pairs; a wrong field count on a line with an odd number of
    quote characters is reported as the unterminated quote it is (the CSV reader reads the
    quoted field on to the next quote, or to the end of the file)."""
    try:
        yield from rows
    except InputError as e:
        if e.line is None or not e.reason.startswith("expected "):
            raise
        lines = text.lstrip("\ufeff").split("\n")
        raw = lines[e.line - 1] if 0 < e.line <= len(lines) else ""
        if raw.count('"') % 2 == 0:
            raise
        raise InputError(f"unterminated quote: the line has an odd number of '\"', so its last quoted field "
                         f"runs on past the line end ({e.reason})", file=e.file, line=e.line) from None


def load_trace(path: str | Path, *, cluster: ClusterSpec | None = None, **import_options) -> tuple[Job, ...]:
    """Load a trace in any supported format (see the module docstring)."""
    return parse_trace(read_trace_text(path), str(path), cluster=cluster, **import_options)


def detect_format(text: str, label: str = "<trace>") -> str:
    first = text.lstrip("\ufeff").split("\n", 1)[0].strip()
    if first == OUR_MAGIC:
        return "ours"
    cols = [c.strip() for c in first.split(",")]
    if set(ARENA_COLUMNS) <= set(cols):
        return "arena"
    if set(PHILLY_COLUMNS) <= set(cols):
        return "philly"
    if first.startswith("#"):
        raise InputError(f"unsupported trace version line {first[:60]!r}; expected {OUR_MAGIC!r}",
                         file=label, line=1)
    for name, expected in (("Arena", ARENA_COLUMNS), ("Philly", PHILLY_COLUMNS)):
        overlap = set(expected) & set(cols)
        if len(overlap) >= 3:
            missing = [c for c in expected if c not in cols]
            raise InputError(f"{name} trace header misses column(s) {', '.join(missing)}",
                             file=label, line=1, field=missing[0])
    raise InputError(f"unknown trace format: first line is neither {OUR_MAGIC!r} nor an Arena "
                     f"({','.join(ARENA_COLUMNS)}) or Philly ({','.join(PHILLY_COLUMNS)}) CSV header",
                     file=label, line=1)


def parse_trace(text: str, label: str = "<trace>", *, cluster: ClusterSpec | None = None,
                **import_options) -> tuple[Job, ...]:
    fmt = detect_format(text, label)
    if fmt == "ours":
        _make_options(_NoOptions, import_options, label)
        jobs, lines = _parse_ours(text, label)
    elif fmt == "arena":
        jobs, lines = _parse_arena(text, label, _make_options(ArenaImportOptions, import_options, label))
    else:
        jobs, lines = _parse_philly(text, label, cluster, _make_options(PhillyImportOptions, import_options, label))
    if cluster is not None:
        check_jobs_fit(jobs, cluster, label, lines)
    return jobs


@dataclass(frozen=True)
class _NoOptions:
    pass


def check_jobs_fit(jobs: Iterable[Job], cluster: ClusterSpec, label: str | None = None,
                   lines: dict[str, int] | None = None) -> None:
    """Reject any job that asks for more GPUs than the cluster (or its requested type) has."""
    by_type = cluster.gpus_by_type()
    total = cluster.num_gpus
    for j in jobs:
        if j.requested_gpus is None:
            continue
        cap = by_type.get(j.requested_gpu_type, total) if j.requested_gpu_type else total
        if j.requested_gpus > cap:
            where = f"{j.requested_gpu_type} GPUs" if j.requested_gpu_type in by_type else "GPUs"
            raise InputError(f"job {j.job_id!r} requests {j.requested_gpus} GPUs but cluster "
                             f"{cluster.name!r} has only {cap} {where}",
                             file=label, line=(lines or {}).get(j.job_id), field="requested_gpus")


def _check_unique(job_id: str, line: int, seen: dict[str, int], label: str, field: str = "job_id") -> None:
    if not job_id:
        raise InputError("must be non-empty", file=label, line=line, field=field)
    if job_id in seen:
        raise InputError(f"duplicate job id {job_id!r} (first on line {seen[job_id]})",
                         file=label, line=line, field=field)
    seen[job_id] = line


def _refuse_other_columns(rows: CsvRows, columns: tuple[str, ...], label: str, fmt: str, line: int = 1) -> None:
    """A column the format does not read is an error, not silently passed over (a
    ``priority`` column in Arena's format would look as if it counted)."""
    extra = [c for c in rows.header if c not in columns]
    if extra:
        raise InputError(f"unknown column(s) {', '.join(map(repr, extra))}; {fmt} reads {', '.join(columns)}",
                         file=label, line=line, field=extra[0])


def _job(label: str, line: int, **kw) -> Job:
    try:
        return Job(**kw)
    except InputError as e:
        raise InputError(e.reason, file=label, line=line, field=e.field) from None
    except ValueError as e:
        raise InputError(str(e), file=label, line=line) from None


# ------------------------------------------------------------------------------------
# our format
# ------------------------------------------------------------------------------------

def _parse_ours(text: str, label: str) -> tuple[tuple[Job, ...], dict[str, int]]:
    rows = CsvRows(text, label, OUR_COLUMNS, skip_lines=1)
    _refuse_other_columns(rows, OUR_COLUMNS, label, "our trace format", line=2)
    jobs, seen = [], {}
    for line, rec in _records(rows, text):
        job_id = rows.raw(rec, "job_id").strip()       # " 1 " is job 1 (and a second "1" a duplicate)
        _check_unique(job_id, line, seen, label)
        tenant = rows.raw(rec, "tenant").strip()
        arrival = rows.time(rec, line, "arrival_s")
        deadline = rows.time(rec, line, "deadline_s", optional=True)
        if deadline is not None and deadline < arrival:
            raise rows.err(line, "deadline_s", f"deadline {deadline} before arrival {arrival}")
        jobs.append(_job(label, line, job_id=job_id, model=rows.model(rec, line, "model"),
                         global_batch=rows.int(rec, line, "global_batch"),
                         num_iterations=rows.int(rec, line, "num_iterations", maximum=MAX_ITERATIONS),
                         arrival_s=arrival, deadline_s=deadline,
                         priority=rows.float(rec, line, "priority", strict_min=True),
                         tenant=tenant,
                         requested_gpu_type=rows.gpu(rec, line, "requested_gpu_type", optional=True),
                         requested_gpus=rows.int(rec, line, "requested_gpus", optional=True)))
    return tuple(jobs), seen


def _fmt_float(v: float) -> str:
    return repr(float(v))


def format_trace(jobs: Iterable[Job]) -> str:
    buf = io.StringIO()
    buf.write(OUR_MAGIC + "\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OUR_COLUMNS)
    seen: set[str] = set()
    for j in jobs:
        if j.job_id in seen:
            raise ValueError(f"duplicate job id {j.job_id!r}")
        seen.add(j.job_id)
        w.writerow([j.job_id, j.model, j.global_batch, j.num_iterations, _fmt_float(j.arrival_s),
                    "" if j.deadline_s is None else _fmt_float(j.deadline_s), _fmt_float(j.priority),
                    j.tenant, j.requested_gpu_type or "", "" if j.requested_gpus is None else j.requested_gpus])
    return buf.getvalue()


def write_trace(jobs: Iterable[Job], path: str | Path, field: str | None = None) -> None:
    """Write jobs in our format (``# arena-trace v1``); ``load_trace`` reads them back exactly.
    A failed write is an ``InputError`` naming ``path`` and ``field`` (``paths.write_output``)."""
    write_output(path, format_trace(jobs), field)


# ------------------------------------------------------------------------------------
# Arena's format
# ------------------------------------------------------------------------------------

def _parse_arena(text: str, label: str, opt: ArenaImportOptions) -> tuple[tuple[Job, ...], dict[str, int]]:
    rows = CsvRows(text, label, ARENA_COLUMNS)
    _refuse_other_columns(rows, ARENA_COLUMNS, label, "Arena's trace format")
    parsed, seen = [], {}
    for line, rec in _records(rows, text):
        job_id = rows.raw(rec, "job_id").strip()
        _check_unique(job_id, line, seen, label)
        sub = rows.time(rec, line, "submission_time")
        dl = rows.time(rec, line, "deadline")
        if dl < sub:
            raise rows.err(line, "deadline", f"deadline {dl} before submission {sub}")
        iters = rows.int(rec, line, "num_iteration", maximum=MAX_ITERATIONS * opt.iteration_divisor)
        parsed.append((line, job_id, sub, dl, iters,
                       rows.model(rec, line, "model_name"), rows.int(rec, line, "batch_size"),
                       rows.int(rec, line, "num_gpu"), rows.gpu(rec, line, "gpu_type")))
    if not parsed:
        return (), {}
    t0 = min(p[2] for p in parsed)
    jobs = []
    for line, job_id, sub, dl, iters, model, batch, gpus, gpu in parsed:
        arrival = sub - t0
        jobs.append(_job(label, line, job_id=job_id, model=model, global_batch=batch,
                         num_iterations=max(1, iters // opt.iteration_divisor), arrival_s=arrival,
                         deadline_s=arrival + (dl - sub) * opt.deadline_slack_factor,
                         requested_gpu_type=gpu, requested_gpus=gpus))
    return tuple(jobs), seen


# ------------------------------------------------------------------------------------
# Philly (Pollux artifact)
# ------------------------------------------------------------------------------------

ARENA_GPU_TYPES = ("a100-40gb", "v100-32gb", "a40", "a10")


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def compact_shape(gpu_type: str, num_gpus: int, gpus_per_node: int):
    """The most compact shape of ``num_gpus`` GPUs on nodes of ``gpus_per_node``:
    the largest power-of-two GPUs per node that fits the node and divides the count."""
    from .grid import Shape
    g = 1
    while g * 2 <= min(gpus_per_node, num_gpus) and num_gpus % (g * 2) == 0:
        g *= 2
    return Shape(gpu_type, num_gpus // g, g)


def _parse_philly(text: str, label: str, cluster: ClusterSpec | None,
                  opt: PhillyImportOptions) -> tuple[tuple[Job, ...], dict[str, int]]:
    import numpy as np

    from .measurements import load_measured_iter_times
    from .oracle import TableOracle

    rows = CsvRows(text, label, PHILLY_COLUMNS)
    _refuse_other_columns(rows, PHILLY_COLUMNS, label, "Philly's trace format (Pollux)")
    recs = []
    for line, rec in _records(rows, text):
        ts = rows.raw(rec, "timestamp").strip()
        try:
            stamp = datetime.fromisoformat(ts)
            if stamp.tzinfo is None:            # naive stamps are read as UTC, never local time
                stamp = stamp.replace(tzinfo=timezone.utc)
            t = stamp.timestamp()
        except ValueError:
            try:
                t = rows.float(rec, line, "timestamp")
            except InputError:
                raise rows.err(line, "timestamp", f"not a date-time or number: {ts!r}") from None
            t = rows.time(rec, line, "timestamp")     # a number of seconds: within the time bound
        if not math.isfinite(t):
            raise rows.err(line, "timestamp", f"not finite: {ts!r}")
        dur = rows.time(rec, line, "duration")
        gpus = rows.int(rec, line, "num_gpus")
        rows.float(rec, line, "gpu_time")
        vc = rows.raw(rec, "cluster").strip() or "default"
        recs.append((t, line, dur, gpus, vc))
    if not recs:
        return (), {}
    t0 = min(r[0] for r in recs)
    window = [(t - t0 - opt.start_s, line, dur, gpus, vc) for t, line, dur, gpus, vc in recs
              if t - t0 >= opt.start_s and (opt.end_s is None or t - t0 < opt.end_s)]
    window.sort(key=lambda r: (r[0], r[1]))
    if opt.max_jobs is not None:
        window = window[:opt.max_jobs]

    oracle = opt.oracle if opt.oracle is not None else TableOracle()
    if cluster is not None:
        by_type = cluster.gpus_by_type()
        per_node = {t: cluster.max_gpus_per_node(t) for t in by_type}
    else:
        by_type = None
        per_node = {t: get_gpu(t).default_gpus_per_node for t in (opt.gpu_types or ARENA_GPU_TYPES)}
    types = opt.gpu_types or tuple(sorted(by_type) if by_type else ARENA_GPU_TYPES)
    for t in types:
        per_node.setdefault(t, get_gpu(t).default_gpus_per_node)
    pairs = sorted({(r.model, r.global_batch) for r in load_measured_iter_times()})
    feasible_cache: dict[tuple[str, int], list[tuple[str, int, float]]] = {}

    def feasible(gpu_type: str, n: int):
        k = (gpu_type, n)
        if k not in feasible_cache:
            shape = compact_shape(gpu_type, n, per_node[gpu_type])
            out = []
            for m, b in pairs:
                it = oracle.iteration_time(m, b, shape)
                if it is not None:
                    out.append((m, b, it))
            feasible_cache[k] = out
        return feasible_cache[k]

    rng = np.random.default_rng(opt.seed)
    jobs = []
    for arrival, line, dur, gpus, vc in window:
        n = min(_next_pow2(gpus), opt.max_gpus)
        cand = [t for t in types if by_type is None or by_type.get(t, 0) >= n]
        if not cand:
            raise rows.err(line, "num_gpus", f"no GPU type of the cluster has {n} GPUs")
        first = int(rng.integers(len(cand)))
        chosen = None
        for k in range(len(cand)):
            t = cand[(first + k) % len(cand)]
            opts = feasible(t, n)
            if opts:
                m, b, it = opts[int(rng.integers(len(opts)))]
                chosen = (t, m, b, it)
                break
        if chosen is None:
            raise rows.err(line, "num_gpus", f"no model of the measured table fits {n} GPUs of any of {cand}")
        t, m, b, it = chosen
        if dur / it > MAX_ITERATIONS:       # the duration is at fault, not the iterations made of it
            raise rows.err(line, "duration", f"{dur:,.6g} s is {dur / it:,.3g} iterations of {m} (batch {b}) on {n} "
                                             f"{t} GPUs, above the limit of {MAX_ITERATIONS:,} iterations per job")
        jobs.append(_job(label, line, job_id=f"philly-{line}", model=m, global_batch=b,
                         num_iterations=max(1, round(dur / it)), arrival_s=arrival, tenant=vc,
                         requested_gpu_type=t, requested_gpus=n))
    return tuple(jobs), {j.job_id: int(j.job_id.split("-")[1]) for j in jobs}


# ------------------------------------------------------------------------------------
# bundled traces
# ------------------------------------------------------------------------------------

BUNDLED_TRACES = {
    "arena-philly": "arena/simulate_trace_philly.csv",
    "arena-venus": "arena/simulate_trace_venus.csv",
    "arena-pai": "arena/simulate_trace_pai.csv",
    "arena-runtime": "arena/runtime_trace.csv",
    "pollux-philly": "pollux/philly.csv.gz",
}


def bundled_trace_text(name: str) -> tuple[str, str]:
    """(text, label) of a trace bundled under instances/data."""
    from importlib import resources
    if name not in BUNDLED_TRACES:
        raise InputError(f"unknown bundled trace {name!r}; known: {', '.join(sorted(BUNDLED_TRACES))}")
    rel = BUNDLED_TRACES[name]
    with resources.files("instances").joinpath(f"data/{rel}").open("rb") as f:
        data = read_bounded(f, f"instances/data/{rel}", "trace")
    return data.decode("utf-8"), f"instances/data/{rel}"


def load_bundled_trace(name: str, *, cluster: ClusterSpec | None = None, **import_options) -> tuple[Job, ...]:
    text, label = bundled_trace_text(name)
    return parse_trace(text, label, cluster=cluster, **import_options)
