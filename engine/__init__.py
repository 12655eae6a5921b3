"""What to decide each round, in parts whose imports point one way
(docs/architecture.md, "Packages"): ``core`` (the round: context, policy seam, round
loop, state, placement, executor, move costs), ``decide`` (policies, objective terms,
formulation, solver backends, incremental search), ``sim`` (the simulator, its
metrics and plots), ``service`` (the live service) and ``cli`` (the ``arena`` command)."""
