"""Solver backends for the per-round model, behind one interface (see base.py)."""
from .base import (BackendUnavailable, Solution, SolverBackend, SolverOptions,  # noqa: F401
                   available_backends, backend_names, make_backend, relative_gap)
