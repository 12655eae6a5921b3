"""How a decision runs for real: mpi4py launcher, torch workers with data/tensor/pipeline
parallelism, checkpoint and resharding, telemetry, the MPI executor."""
