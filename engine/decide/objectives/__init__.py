"""Objective terms of the per-round model (registry by name; see base.py)."""
from .base import Objective, make_term, parse_objective, register_term, split_objective_config, term_names  # noqa: F401
