"""Solver backends for the per-round model, behind one interface (see base.py)."""
from .base import (  # noqa: F401
                   BackendUnavailable,
                   Solution,
                   SolverBackend,
                   SolverOptions,
                   available_backends,
                   backend_names,
                   make_backend,
                   relative_gap,
)
