"""One round of the incremental search, from round data to a decision: candidate
columns, the round's model restricted to them, the search. Shared by the optimizing
policies (``search=incremental``, ``suika``) and ``arena bench incremental``."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..formulation import build_model
from ..formulation.model import MilpModel
from ..formulation.round_data import RoundData
from ..objectives import Objective
from ..solvers.base import Solution
from .candidates import OTHER_TYPE_CHOICES, QUEUED_CHOICES, candidate_columns
from .search import SearchSteps, incremental_search


@dataclass(frozen=True)
class IncrementalConfig:
    """``queued``: a queued job's candidates (``all`` its columns, or ``small``: at most
    its reference GPU count); ``other_type``: a running job's candidates on another GPU
    type (``same``: its current GPU count, or ``any`` count; most compact node shape);
    ``move_budget_jobs``: at most this fraction of the running
    jobs change column per round (at least one when > 0); ``move_budget_gpus``: at most
    this fraction of the cluster's GPUs in the columns moved jobs land on (1 and 1: no
    budget)."""
    queued: str = "all"
    other_type: str = "same"
    move_budget_jobs: float = 1.0
    move_budget_gpus: float = 1.0
    steps: SearchSteps = field(default_factory=SearchSteps)

    def __post_init__(self):
        if self.queued not in QUEUED_CHOICES:
            raise ValueError(f"queued must be one of {', '.join(QUEUED_CHOICES)}, got {self.queued!r}")
        if self.other_type not in OTHER_TYPE_CHOICES:
            raise ValueError(f"other_type must be one of {', '.join(OTHER_TYPE_CHOICES)}, got {self.other_type!r}")
        for name in ("move_budget_jobs", "move_budget_gpus"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"{name} must be a fraction in [0, 1], got {v!r}")

    def limits(self, data: RoundData) -> tuple[float, float]:
        """(jobs, GPUs) that may move this round."""
        running = int(np.sum(data.current_col >= 0))
        total = sum(data.capacity.total(t) for t in range(len(data.capacity.types)))
        return math.ceil(self.move_budget_jobs * running), math.ceil(self.move_budget_gpus * total)


def search_round(data: RoundData, objective: Objective, config: IncrementalConfig,
                 pinned: frozenset[str] = frozenset(), frozen: frozenset[str] = frozenset(),
                 allowance: int | None = None, exclude: np.ndarray | None = None
                 ) -> tuple[MilpModel, np.ndarray, Solution]:
    """(restricted model, its columns' indices in ``data``, the search's solution, whose
    ``extra`` also holds the wall time of the candidates and of the model's build).
    ``frozen`` job ids keep exactly their current column (a frozen job that holds no
    GPUs has nothing to keep and is not constrained); ``allowance`` (the stability rule's
    cluster-wide budget) caps the running jobs that change column below the config's;
    ``exclude`` (a mask over ``data``'s columns) leaves those columns out of the candidates,
    a running job's current column excepted (the columns placement could not map)."""
    t0 = time.perf_counter()
    cols = candidate_columns(data, config.queued, config.other_type)
    if exclude is not None:
        cur = data.current_col[data.col_job[cols]]
        cols = cols[~exclude[cols] | (cur == cols)]
    t1 = time.perf_counter()
    if objective.columnwise:            # the same model, built from the candidate columns alone
        part = data.restricted(cols)
        model, start = build_model(part, objective, pinned), part.current_col
    else:                               # a term reads a job's other columns: build over all, then restrict
        model, start = build_model(data, objective, pinned, columns=cols), data.current_among(cols)
    t2 = time.perf_counter()
    frozen_mask = np.zeros(data.n_jobs, dtype=bool)
    if frozen:
        frozen_mask[:] = [jid in frozen for jid in data.job_ids]
    max_jobs, max_gpus = config.limits(data)
    if allowance is not None:
        max_jobs = min(max_jobs, allowance)
    sol = incremental_search(model, start, data.col_gpus[cols], data.col_type[cols], frozen=frozen_mask,
                             max_moved_jobs=max_jobs, max_moved_gpus=max_gpus,
                             steps=config.steps)
    sol.extra.update(candidates_s=t1 - t0, model_s=t2 - t1)     # the search's own time is sol.solve_time_s
    return model, cols, sol
