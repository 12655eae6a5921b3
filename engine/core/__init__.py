"""The round, whoever drives it: the context a policy reads and the decisions it returns,
the policy seam and registry, the round loop and its state, placement, the executor
protocol, invariants, the reconfiguration cost model and the move ledger, the shadow
comparison and the online feed. Imports nothing of the engine's other parts."""
