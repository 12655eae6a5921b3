"""The per-round optimization model: round data (jobs x candidate grids as arrays),
the MILP built from it, and synthetic rounds for benchmarks."""
from .build import add_job_rows, add_shape_rows, build_model, hint_from_columns  # noqa: F401
from .model import MilpModel, ModelBuilder  # noqa: F401
from .round_data import Capacity, RoundData, build_round_data, columns_of_jobs, find_column  # noqa: F401
from .synthetic import synthetic_round_data, tiny_round_data  # noqa: F401
