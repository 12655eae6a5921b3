"""Incremental re-scheduling: a local search from the current allocation over a
neighbourhood of candidate columns, on the round's own model (same objective
coefficients and rows as the full MILP, restricted to the candidates)."""
from .candidates import OTHER_TYPE_CHOICES, QUEUED_CHOICES, candidate_columns  # noqa: F401
from .round import IncrementalConfig, search_round  # noqa: F401
from .search import SearchSteps, incremental_search  # noqa: F401
