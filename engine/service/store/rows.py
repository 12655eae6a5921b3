"""The rows the service's store reads back, as typed records."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    spec: dict                  # JobSpec.to_dict(); JobSpec.from_dict(spec) re-validates it
    status: str
    submitted_at: float
    updated_at: float
    submitted_by: str | None = None     # the user whose token submitted it (None: no token)


@dataclass(frozen=True)
class HistoryRow:
    job_id: int
    from_status: str | None
    to_status: str
    reason: str
    at: float


@dataclass(frozen=True)
class LaunchRow:
    job_id: int
    generation: int
    plan: dict
    gpus: tuple[str, ...]
    state: str
    pid_info: dict | None
    reason: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class RoundRow:
    idx: int
    at: float
    policy: str
    trigger: str
    objective: float | None
    gap: float | None
    solve_time_s: float
    decisions: dict


@dataclass(frozen=True)
class MeasurementRow:
    job_id: int
    generation: int
    at: float
    step: int | None
    iteration_time_s: float | None
    reconfig: dict


@dataclass(frozen=True)
class CheckpointRow:
    job_id: int
    generation: int
    step: int
    path: str
    at: float
