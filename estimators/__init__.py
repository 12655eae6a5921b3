"""How fast and how big a job is on a grid: layer costs, profiler, profile store,
analytic composition, memory model, planner, learned load-aware regressor; how good the
estimates are lives apart, in ``estimators.evaluation``."""
from .base import Estimate, LearnsOnline, PerformanceModel
from .perf import kind_names, make_performance_model

__all__ = ["Estimate", "LearnsOnline", "PerformanceModel", "make_performance_model", "kind_names"]
