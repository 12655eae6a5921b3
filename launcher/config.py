"""Validated value objects of the launcher: the parallel plan and one training run's config.

Every knob of a launched job lives here (one place), is validated on construction and is
serialised to JSON for the ranks (``to_json`` / ``from_json``), so a run is reproducible
from its config file alone.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from instances.cluster import MAX_CLUSTER_GPUS
from instances.errors import InputError
from instances.jobs import MAX_GLOBAL_BATCH, MAX_ITERATIONS
from instances.limits import MAX_SEED, check_time, show_number
from instances.plan import Plan
from instances.structured import loads_json

MOVE_PATHS = ("d2d", "storage")       # how a running job moves: device to device where it can, or via storage

SCHEDULES = ("gpipe", "1f1b")
DEVICES = ("auto", "cpu", "cuda")
# Periodic checkpoints whenever a checkpoint folder is given (a killed run loses at most
# one interval): about this many per run, and at least one per this many seconds.
DEFAULT_CHECKPOINTS_PER_RUN = 10
DEFAULT_CHECKPOINT_INTERVAL_S = 600.0
# A job with no finished step for this long is reported as stalled and stopped by
# ``launcher.api.run_config``; the collective timeout is longer, so the stall is seen first.
DEFAULT_STALL_TIMEOUT_S = 120.0
DEFAULT_COMM_TIMEOUT_S = 300.0
FLOAT32_MAX = 3.4028234663852886e38   # the largest float32: the launcher trains in float32


@dataclass(frozen=True)
class ParallelPlan:
    """Data x tensor x pipeline degrees, micro-batches and pipeline schedule.

    ``stage_layers`` optionally fixes how many decoder layers each pipeline stage holds
    (empty: as even a split as possible, earlier stages taking the remainder).
    """
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    stage_layers: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "microbatches"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"must be a positive integer, got {v!r}", field=name)
            if name == "microbatches" and v > MAX_GLOBAL_BATCH:
                raise InputError(f"must be at most {MAX_GLOBAL_BATCH:,} (the bound on a global batch: a "
                                 f"micro-batch holds a sample at least), got {show_number(v)}", field=name)
        if self.world_size > MAX_CLUSTER_GPUS:          # (one rank a GPU: no cluster arena schedules has more)
            raise InputError(f"dp*tp*pp = {show_number(self.world_size)} ranks, more than the {MAX_CLUSTER_GPUS:,} "
                             "GPUs a cluster may have", field="dp")
        if self.schedule not in SCHEDULES:
            raise InputError(f"unknown pipeline schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}",
                             field="schedule")
        object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        sl = self.stage_layers
        if sl and (len(sl) != self.pp or min(sl) < 0 or (self.pp > 1 and min(sl[1:-1], default=1) < 1)
                   or (self.pp == 1 and sl[0] < 1)):
            raise InputError(f"needs {self.pp} decoder-layer counts, positive except on the first "
                             f"stage (which holds the embeddings) and the last (the head), got {sl}",
                             field="stage_layers")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"dp={self.dp},tp={self.tp},pp={self.pp}"

    @classmethod
    def parse(cls, text: str, **extra) -> "ParallelPlan":
        """Parse ``"dp=2,tp=1,pp=2"`` (missing degrees default to 1)."""
        degrees: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, val = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in ("dp", "tp", "pp"):
                raise InputError(f"expected dp=D,tp=T,pp=P, got {text!r}", field="plan")
            if key in degrees:
                raise InputError(f"degree {key} given twice in {text!r}", field="plan")
            try:
                degrees[key] = int(val)
            except ValueError:
                raise InputError(f"degree {key} must be an integer, got {val!r}", field="plan") from None
        if not degrees:
            raise InputError(f"expected dp=D,tp=T,pp=P, got {text!r}", field="plan")
        return cls(**degrees, **extra)

    @classmethod
    def from_plan(cls, plan: Plan | ParallelPlan) -> ParallelPlan:
        """The launcher's form of a scheduler's ``instances.plan.Plan`` (or the plan itself)."""
        if isinstance(plan, ParallelPlan):
            return plan
        return cls(dp=plan.dp, tp=plan.tp, pp=plan.pp, microbatches=plan.microbatches,
                   schedule=plan.schedule, stage_layers=tuple(plan.stage_layers))


@dataclass(frozen=True)
class OptimizerConfig:
    """Adam hyper-parameters (no weight decay, no clipping, constant learning rate). A
    learning rate so large that training diverges is accepted: the run stops at its first
    non-finite loss (launcher/worker.py)."""
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8

    def __post_init__(self):
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise InputError(f"must be in [0, 1), got {getattr(self, name)!r}", field=name)
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (math.isfinite(self.lr)
                                                                                       and self.lr > 0):
            raise InputError(f"must be a finite number > 0, got {self.lr!r}", field="lr")
        if self.lr / (1 - self.beta1) > FLOAT32_MAX:        # torch refuses the step size mid-run
            raise InputError(f"must be at most {(1 - self.beta1) * FLOAT32_MAX:.3g}: Adam's first step size, "
                             f"lr / (1 - beta1), must be a float32 number (at most {FLOAT32_MAX:.3g}), got "
                             f"{self.lr!r}", field="lr")
        if not self.eps > 0:
            raise InputError(f"must be > 0, got {self.eps!r}", field="eps")


@dataclass(frozen=True)
class TrainConfig:
    """One launched training run (all ranks read the same config)."""
    model: str
    plan: ParallelPlan
    steps: int                                  # total steps; a resumed run continues to this
    global_batch: int | None = None             # samples per step; None: dp * microbatches
    seed: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None         # steps; None: steps // DEFAULT_CHECKPOINTS_PER_RUN
                                                # with a checkpoint_dir; 0: none periodic
    checkpoint_interval_s: float | None = None  # seconds; None: DEFAULT_CHECKPOINT_INTERVAL_S with a
                                                # checkpoint_dir; 0: none time-based
    checkpoint_keep: int = 2                    # completed checkpoints kept on disk
    checkpoint_at_end: bool = True
    run_dir: str = ""                           # per-launch scratch: results, pids, progress
    progress_path: str | None = None            # JSON progress file the engine polls
    telemetry_store: str | None = None          # dir holding measured_runs.jsonl; None: not recorded
    telemetry_path: str | None = None           # per-run JSONL copy of every step's record
    breakdown: bool = False                     # per-stage compute/communication split
    data_path: str | None = None                # local text file read as bytes; None: synthetic
    data_roots: tuple[str, ...] | None = None   # the data file must lie in one of these folders; None: anywhere
    device: str = "auto"                        # auto: cuda when available, else cpu
    gpu_type: str | None = None                 # catalog GPU name recorded in telemetry; None: inferred
    num_nodes: int = 1
    gpus_per_node: int | None = None            # None: world size / num_nodes
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    step_delay_s: float = 0.0                   # sleep after each step (tests: slow a tiny run down)
    comm_timeout_s: float = DEFAULT_COMM_TIMEOUT_S   # torch.distributed collective timeout
    stall_timeout_s: float | None = DEFAULT_STALL_TIMEOUT_S  # no step for this long: stalled (None: off)
    # (host name as the launch names it, its address) for a launch over hosts (launcher/dist.py): the
    # ranks' process groups use these addresses; () : one host, 127.0.0.1
    host_addrs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        from instances.models import canonical_model_name
        object.__setattr__(self, "model", canonical_model_name(self.model))
        if not isinstance(self.plan, ParallelPlan):
            raise InputError("must be a ParallelPlan", field="plan")
        gb = self.global_batch if self.global_batch is not None else self.plan.dp * self.plan.microbatches
        object.__setattr__(self, "global_batch", gb)
        for name, top in (("steps", MAX_ITERATIONS), ("global_batch", MAX_GLOBAL_BATCH), ("num_nodes", None),
                          ("seed", MAX_SEED)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "seed" else 1):
                raise InputError(f"must be a{'n integer >= 0' if name == 'seed' else ' positive integer'}, "
                                 f"got {v!r}", field=name)
            if top is not None and v > top:             # (the bounds a job has: instances/jobs.py, limits.py)
                raise InputError(f"must be at most {top:,}, got {show_number(v)}", field=name)
        every = self.checkpoint_every
        if every is None:
            every = max(1, self.steps // DEFAULT_CHECKPOINTS_PER_RUN) if self.checkpoint_dir else 0
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise InputError(f"must be an integer >= 0, got {every!r}", field="checkpoint_every")
        object.__setattr__(self, "checkpoint_every", every)
        interval = self.checkpoint_interval_s
        if interval is None:
            interval = DEFAULT_CHECKPOINT_INTERVAL_S if self.checkpoint_dir else 0.0
        if not (isinstance(interval, (int, float)) and interval >= 0):
            raise InputError(f"must be >= 0 seconds, got {interval!r}", field="checkpoint_interval_s")
        object.__setattr__(self, "checkpoint_interval_s", float(interval))
        if self.stall_timeout_s is not None and not self.stall_timeout_s > 0:
            raise InputError(f"must be > 0 seconds (or None: off), got {self.stall_timeout_s!r}",
                             field="stall_timeout_s")
        if self.data_roots is not None:
            roots = self.data_roots
            if isinstance(roots, str) or not isinstance(roots, (list, tuple)) or not roots or \
                    not all(isinstance(r, str) and r for r in roots):
                raise InputError(f"must be a non-empty list of folders (or None: anywhere), got {roots!r}",
                                 field="data_roots")
            object.__setattr__(self, "data_roots", tuple(roots))
        pairs = self.host_addrs.items() if isinstance(self.host_addrs, dict) else self.host_addrs
        if not isinstance(pairs, (list, tuple, type({}.items()))) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) and x for x in p)
                for p in pairs):
            raise InputError(f"must be (host, address) pairs, got {self.host_addrs!r}", field="host_addrs")
        object.__setattr__(self, "host_addrs", tuple((h, a) for h, a in pairs))
        if self.checkpoint_keep < 1:
            raise InputError(f"must be >= 1, got {self.checkpoint_keep}", field="checkpoint_keep")
        if self.device not in DEVICES:
            raise InputError(f"unknown device {self.device!r}; known: {', '.join(DEVICES)}", field="device")
        if not 0 <= self.step_delay_s < float("inf"):           # (nan and inf too: a rank sleeps it)
            raise InputError(f"must be a finite number of seconds >= 0, got {self.step_delay_s!r}",
                             field="step_delay_s")
        if not 0 < self.comm_timeout_s < float("inf"):
            raise InputError(f"must be a finite number of seconds > 0, got {self.comm_timeout_s!r}",
                             field="comm_timeout_s")
        for f in ("checkpoint_interval_s", "step_delay_s", "comm_timeout_s", "stall_timeout_s"):
            if getattr(self, f) is not None:            # within the bound on times (instances/limits.py)
                check_time(getattr(self, f), field=f)
        gpn = self.gpus_per_node if self.gpus_per_node is not None else -(-self.plan.world_size // self.num_nodes)
        object.__setattr__(self, "gpus_per_node", gpn)
        if self.plan.stage_layers:
            object.__setattr__(self, "plan", replace(self.plan, stage_layers=decoder_stage_layers(
                self.model, self.plan.stage_layers)))

    def to_json(self) -> dict:
        d = asdict(self)
        d["plan"]["stage_layers"] = list(self.plan.stage_layers)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        """Build from ``to_json``'s dict; any wrong key or type is an ``InputError``."""
        if not isinstance(d, dict):
            raise InputError(f"must be an object, got {type(d).__name__}", field="config")
        d = dict(d)
        _check_keys(d, cls, "config")
        for key, sub in (("plan", ParallelPlan), ("optimizer", OptimizerConfig)):
            part = d.get(key, {})
            if not isinstance(part, dict):
                raise InputError(f"must be an object, got {part!r}", field=key)
            _check_keys(part, sub, key)
        plan = d.get("plan", {})
        try:
            stage_layers = tuple(plan.get("stage_layers", ()))
            d["plan"] = ParallelPlan(**{**plan, "stage_layers": stage_layers})
            d["optimizer"] = OptimizerConfig(**d.get("optimizer", {}))
            return cls(**d)
        except TypeError as e:          # a value of the wrong JSON type (compared, iterated...)
            raise InputError(f"a value has the wrong type: {e}", field="config") from None

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def read(cls, path: str | Path) -> "TrainConfig":
        raw = loads_json(Path(path).read_bytes(), file=str(path))
        try:
            return cls.from_json(raw)
        except InputError as e:
            raise InputError(e.reason, file=str(path), field=e.field) from None


def _check_keys(d: dict, cls, where: str) -> None:
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise InputError(f"unknown keys {sorted(map(str, unknown))}", field=where)


def decoder_stage_layers(model: str, stage_layers: tuple[int, ...]) -> tuple[int, ...]:
    """Accept stage layer counts over the repeated layers (sum == ``num_blocks``: decoder
    layers or Wide-ResNet blocks) or over ``ModelArch.layers()`` (sum == num_blocks + 2:
    embedding or stem on the first stage, head or classifier on the last, as the estimators
    count them) and return block counts (the first or last stage may then hold none)."""
    from instances.models import get_model
    L = get_model(model).num_blocks
    total = sum(stage_layers)
    if total == L:
        return tuple(stage_layers)
    if total == L + 2:
        out = list(stage_layers)
        out[0] -= 1
        out[-1] -= 1
        if min(out) < 0 or min(out[1:-1], default=1) < 1:
            raise InputError(f"stage_layers {stage_layers} leave a stage with nothing to run",
                             field="stage_layers")
        return tuple(out)
    raise InputError(f"stage_layers {stage_layers} sum to {total}; model {model} has {L} repeated "
                     f"layers ({L + 2} counting its first and last layer)", field="stage_layers")
