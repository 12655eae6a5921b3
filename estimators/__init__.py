"""How fast and how big a job is on a grid: layer costs, profiler, profile store,
analytic composition, memory model, planner, learned load-aware regressor."""
