"""How a policy decides: the built-in policies, objective terms, the MILP formulation,
solver backends, the incremental search, the stability rule. Imports only
``engine.core`` of the engine."""
