"""What to decide each round: state, round context, grids, objectives, formulation,
solver backends, policies, placement, reconfiguration cost, simulator, metrics, CLI."""
