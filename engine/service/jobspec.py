"""A job submitted to the service: a typed ``JobSpec`` read from a TOML file or from a
dict (the body an HTTP API would receive), validated completely before anything is stored.

A TOML job file holds flat keys::

    name = "llama-ft"                       # letters, digits, . _ -; at most 64
    model = "models/my-config.json"         # catalog name, or a config.json (relative: to this file)
    global_batch = 8                        # samples per step
    steps = 200                             # training iterations
    gpu_type = "a100"                       # optional: only this GPU type
    gpus = 4                                # optional: the GPU count asked for (Job.requested_gpus)
    priority = 1.0                          # optional, in [1e-4, 1e4]
    tenant = "team-a"                       # optional
    deadline_s = 3600                       # optional: seconds after submission (<= 9e12)
    seed = 0                                # optional: initialisation and synthetic data
    data = "corpus.txt"                     # optional: a local file read as bytes (relative: to this file)
    after = [3, 4]                          # optional: start only once these jobs (of this service) finished

Any other key is refused. Every refusal is an ``InputError`` naming the source (the TOML
file, or ``request`` for a dict) and the key.

Files: the data file is checked as the launcher will open it (launcher/datafile.py: a
regular readable file of at least the model's context + 2 bytes, at most
``MAX_DATA_BYTES``; any content, one token a byte). Given ``roots`` (the service's data
roots), the data file and a config.json model must lie in one of those folders once links
and ``..`` are resolved, checked before either is opened.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from instances.cluster import ClusterSpec
from instances.errors import InputError
from instances.gpus import canonical_gpu_name
from instances.jobs import MAX_GLOBAL_BATCH, MAX_ITERATIONS, Job
from instances.limits import MAX_SEED, MAX_TIME_S, check_priority, check_time
from instances.models import canonical_model_name, get_model
from instances.paths import check_within_roots
from instances.structured import check_depth, loads_toml
from launcher.datafile import DATA_ROOT_FLAG, check_data_file, min_data_bytes

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")     # fullmatch: "$" would let a final "\n" in
MAX_TOML_BYTES = 64 * 1024          # a job file is a few lines; more is not one
REQUEST = "request"                 # the source named in errors for a dict
MAX_AFTER = 64                      # jobs a job may wait for
MAX_JOB_ID = 2**63 - 1              # SQLite's largest integer: no job id is larger


@dataclass(frozen=True)
class JobSpec:
    name: str
    model: str                      # canonical: a catalog name or a config.json's absolute path
    global_batch: int
    steps: int
    gpu_type: str | None = None     # canonical GPU catalog name
    gpus: int | None = None
    priority: float = 1.0
    tenant: str = "default"
    deadline_s: float | None = None # seconds after submission
    seed: int = 0
    data: str | None = None         # absolute path of a local text file; None: synthetic data
    after: tuple[int, ...] = ()     # ids of this service's jobs that must finish before it starts

    def __post_init__(self):
        _check(self)

    @classmethod
    def from_dict(cls, d, *, source: str = REQUEST, base_dir: str | Path | None = None,
                  cluster: ClusterSpec | None = None, roots: tuple[str, ...] | None = None,
                  check_files: bool = True) -> "JobSpec":
        """Validate ``d``; relative paths (a config.json model, ``data``) are taken from
        ``base_dir`` (default: the working folder); ``cluster``: refuse more GPUs (or a GPU
        type) than it has; ``roots``: refuse a data file or config.json outside these
        folders (None: anywhere); ``check_files``: check the data file (off for a spec read
        back from the state database, whose file is checked again when the job launches)."""
        if not isinstance(d, dict):
            raise InputError(f"a job is an object of keys, got {type(d).__name__}", file=source)
        check_depth(d, file=source)             # a dict built in code (the API's is checked as it is read)
        unknown = sorted(set(d) - set(JOB_KEYS), key=str)
        if unknown:
            raise InputError(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(JOB_KEYS)}",
                             file=source, field=str(unknown[0]))
        for f in ("name", "model", "global_batch", "steps"):
            if f not in d:
                raise InputError("missing", file=source, field=f)
        d = dict(d)
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        for f in ("model", "data"):
            v = d.get(f)
            if isinstance(v, str) and (f == "data" or v.strip().lower().endswith(".json")):
                if "\0" in v:
                    raise InputError("a path cannot hold a NUL character", file=source, field=f)
                given = Path(v.strip())         # an absolute path as given (a stored spec's is not re-resolved)
                d[f] = str(given if given.is_absolute() else (base / given).resolve())
                if roots is not None and (f == "data" or d[f].lower().endswith(".json")):
                    try:                            # before the file is looked at
                        check_within_roots(d[f], roots, f, what="jobs' files",
                                           how_to_allow=f"move it into one of them, or ask the operator to add "
                                                        f"its folder ({DATA_ROOT_FLAG})")
                    except InputError as e:
                        raise InputError(e.reason, file=source, field=f) from None
        try:
            spec = cls(**d)
        except InputError as e:                     # name the source (file or request)
            raise InputError(e.reason, file=source, line=e.line, field=e.field) from None
        if check_files and spec.data is not None:
            try:
                check_data_file(spec.data, min_bytes=min_data_bytes(get_model(spec.model).seq_len), roots=roots)
            except InputError as e:
                raise InputError(f"{spec.data}: {e.reason}", file=source, field="data") from None
        if cluster is not None:
            spec.check_cluster(cluster, source=source)
        return spec

    @classmethod
    def from_toml(cls, path: str | Path, *, cluster: ClusterSpec | None = None,
                  roots: tuple[str, ...] | None = None) -> "JobSpec":
        p = Path(path)
        if p.is_dir():
            raise InputError("is a folder, not a job file", file=str(p))
        try:
            with p.open("rb") as f:
                raw = f.read(MAX_TOML_BYTES + 1)     # enough to tell it is too large
        except FileNotFoundError:
            raise InputError("job file not found", file=str(p)) from None
        except OSError as e:
            raise InputError(f"cannot read the job file: {e.strerror or e}", file=str(p)) from None
        return cls.from_toml_text(raw, source=str(p), base_dir=p.resolve().parent, cluster=cluster, roots=roots)

    @classmethod
    def from_toml_text(cls, text: str | bytes, *, source: str = REQUEST, base_dir: str | Path | None = None,
                       cluster: ClusterSpec | None = None, roots: tuple[str, ...] | None = None) -> "JobSpec":
        if len(text) > MAX_TOML_BYTES:
            raise InputError(f"larger than {MAX_TOML_BYTES} bytes; not a job file", file=source)
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError("not UTF-8 text (expected TOML)", file=source) from None
        d = loads_toml(text, file=source)
        return cls.from_dict(d, source=source, base_dir=base_dir, cluster=cluster, roots=roots)

    def check_cluster(self, cluster: ClusterSpec, *, source: str = REQUEST) -> None:
        """Refuse a request the cluster can never satisfy: a GPU type it lacks, more GPUs
        than it has of one type."""
        by_type = cluster.gpus_by_type()
        if self.gpu_type is not None and self.gpu_type not in by_type:
            raise InputError(f"cluster {cluster.name!r} has no {self.gpu_type} GPUs; it has "
                             f"{', '.join(sorted(by_type))}", file=source, field="gpu_type")
        if self.gpus is None:
            return
        if self.gpu_type is not None:                # a job runs on one GPU type (its grid's)
            have, what = by_type[self.gpu_type], f"{self.gpu_type} GPUs"
        else:
            what, have = max(((f"{t} GPUs (its largest type)", n) for t, n in by_type.items()), key=lambda x: x[1])
        if self.gpus > have:
            raise InputError(f"{self.gpus} requested; a job runs on one GPU type and cluster {cluster.name!r} "
                             f"has {have} {what}", file=source, field="gpus")

    def to_dict(self) -> dict:
        """JSON-ready; ``from_dict`` of it gives this spec back."""
        d = {k: v for k, v in asdict(self).items() if v is not None}
        if self.after:
            d["after"] = list(self.after)
        else:
            del d["after"]
        return d

    def with_frozen_model(self, folder: str | Path) -> "JobSpec":
        """This spec with a ``config.json`` model copied into ``folder`` under its content's
        SHA-256 (the service keeps its own copy at submission: editing or deleting the
        user's file later changes nothing for the job, its checkpoints or its telemetry).
        A catalog model is returned as is."""
        import hashlib
        import shutil
        if not self.model.lower().endswith(".json"):
            return self
        data = Path(self.model).read_bytes()
        dest = Path(folder) / f"{hashlib.sha256(data).hexdigest()[:16]}-{Path(self.model).name}"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".tmp")
            shutil.copyfile(self.model, tmp)
            tmp.replace(dest)
        return JobSpec.from_dict({**self.to_dict(), "model": str(dest)}, check_files=False)

    def to_job(self, job_id: str, arrival_s: float) -> Job:
        """The engine's job, arriving at ``arrival_s`` on the loop's clock. The seed and the
        data file are the launcher's (``TrainConfig``), not the scheduler's. A deadline that
        the clock would put past the bound on times (``deadline_s`` near 9e12 s after an
        arrival on the wall clock) is that bound: 285,000 years away, no constraint either way."""
        return Job(job_id, self.model, self.global_batch, self.steps, arrival_s,
                   deadline_s=None if self.deadline_s is None else min(arrival_s + self.deadline_s, MAX_TIME_S),
                   priority=self.priority, tenant=self.tenant, requested_gpu_type=self.gpu_type,
                   requested_gpus=self.gpus)



JOB_KEYS = tuple(f.name for f in fields(JobSpec))     # a job file's and a request body's keys, in order

def _check(spec: JobSpec) -> None:
    """Validate and canonicalise ``spec`` in place (model and GPU names)."""
    def err(field: str, msg: str) -> InputError:
        return InputError(msg, file=REQUEST, field=field)

    def integer(field: str, lo: int, hi: int | None = None, optional: bool = False) -> None:
        v = getattr(spec, field)
        if v is None and optional:
            return
        if isinstance(v, bool) or not isinstance(v, int):
            raise err(field, f"must be an integer, got {v!r}")
        if v < lo or (hi is not None and v > hi):
            raise err(field, f"must be {'>= ' + str(lo) if hi is None else f'in [{lo}, {hi}]'}, got {v}")

    def text(field: str) -> str:
        v = getattr(spec, field)
        if not isinstance(v, str):
            raise err(field, f"must be a string, got {v!r}")
        return v

    if not NAME_RE.fullmatch(text("name")):
        raise err("name", f"{spec.name!r}: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if not NAME_RE.fullmatch(text("tenant")):
        raise err("tenant", f"{spec.tenant!r}: 1-64 letters, digits, '.', '_' or '-'")
    try:
        object.__setattr__(spec, "model", canonical_model_name(text("model")))
    except InputError as e:              # a config.json's own error names that file and its field
        raise err("model", str(e) if e.file else e.reason) from None
    integer("global_batch", 1, MAX_GLOBAL_BATCH)
    integer("steps", 1, MAX_ITERATIONS)
    integer("gpus", 1, optional=True)
    integer("seed", 0, MAX_SEED)
    after = spec.after
    if isinstance(after, list):
        after = tuple(after)
    if not isinstance(after, tuple) or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_JOB_ID
                                           for x in after):
        raise err("after", f"a list of job ids (integers 1..{MAX_JOB_ID}), got {spec.after!r}")
    if len(after) > MAX_AFTER or len(set(after)) != len(after):
        raise err("after", f"at most {MAX_AFTER} distinct job ids, got {list(after)}")
    object.__setattr__(spec, "after", after)
    if spec.gpu_type is not None:
        try:
            object.__setattr__(spec, "gpu_type", canonical_gpu_name(text("gpu_type")))
        except InputError as e:
            raise err("gpu_type", e.reason) from None
    object.__setattr__(spec, "priority", check_priority(spec.priority, file=REQUEST))
    if spec.deadline_s is not None:
        object.__setattr__(spec, "deadline_s", check_time(spec.deadline_s, field="deadline_s", file=REQUEST,
                                                          strict_min=True))
    if spec.data is not None:
        text("data")                                # (the file itself: from_dict's check_files)
        if not get_model(spec.model).is_transformer:
            raise err("data", f"model {spec.model} trains on synthetic images; a data file is for token models")
