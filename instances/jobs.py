"""Jobs: one training run each."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .arch import ModelArch
from .errors import InputError
from .gpus import canonical_gpu_name
from .limits import check_priority, check_time
from .models import canonical_model_name, get_model

# Refused above this: the largest bundled trace job has 15.3 M iterations (Philly, before
# the /5), and 1e9 iterations at 0.1 s each is already 3 simulated years on one grid.
MAX_ITERATIONS = 10**9
# Refused above this many samples per iteration: a thousand times the largest batch of the
# bundled traces and the measured table (1,024); a typo such as 1e20 would otherwise be
# estimated as a plan that fits nowhere (``arena estimate --batch``) or waits forever.
MAX_GLOBAL_BATCH = 2**20


@dataclass(frozen=True)
class Job:
    job_id: str
    model: str                      # canonical model name: catalog ("gpt__1.3B") or a config.json path
    global_batch: int               # samples per iteration
    num_iterations: int
    arrival_s: float
    deadline_s: float | None = None
    priority: float = 1.0
    tenant: str = "default"
    requested_gpu_type: str | None = None
    requested_gpus: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "model", canonical_model_name(self.model))
        if self.requested_gpu_type is not None:
            object.__setattr__(self, "requested_gpu_type", canonical_gpu_name(self.requested_gpu_type))
        if not self.job_id:
            raise ValueError("job_id must be non-empty")
        for name in ("job_id", "tenant"):     # the trace readers strip them: "1" and " 1 " are one job
            v = getattr(self, name)
            if not isinstance(v, str) or v != v.strip() or not v:
                raise InputError(f"job {self.job_id!r}: {name} must be a non-empty string without white space "
                                 f"around it, got {v!r}", field=name)
        if self.global_batch < 1:
            raise ValueError(f"job {self.job_id}: global_batch must be >= 1")
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise InputError(f"job {self.job_id}: a global batch of {self.global_batch:,} samples is above the limit "
                             f"of {MAX_GLOBAL_BATCH:,} (a thousand times the largest measured batch)",
                             field="global_batch")
        if self.num_iterations < 1:
            raise ValueError(f"job {self.job_id}: num_iterations must be >= 1")
        if self.num_iterations > MAX_ITERATIONS:
            raise InputError(f"job {self.job_id}: {self.num_iterations:,} iterations is above the limit of "
                             f"{MAX_ITERATIONS:,} (at 0.1 s per iteration that is 3 simulated years)",
                             field="num_iterations")
        if not math.isfinite(self.arrival_s) or self.arrival_s < 0:
            raise ValueError(f"job {self.job_id}: arrival_s must be a finite time >= 0")
        check_time(self.arrival_s, field="arrival_s", what=f"job {self.job_id}: ")
        if self.deadline_s is not None and not self.deadline_s >= self.arrival_s:
            raise ValueError(f"job {self.job_id}: deadline_s before arrival")
        if self.deadline_s is not None:
            check_time(self.deadline_s, field="deadline_s", what=f"job {self.job_id}: ")
        if self.requested_gpus is not None and self.requested_gpus < 1:
            raise ValueError(f"job {self.job_id}: requested_gpus must be >= 1")
        if not self.priority > 0:
            raise ValueError(f"job {self.job_id}: priority must be > 0")
        check_priority(self.priority, what=f"job {self.job_id}: ")

    @property
    def arch(self) -> ModelArch:
        return get_model(self.model)
