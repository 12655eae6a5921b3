"""The project's one memory rule: the bytes a training job keeps per parameter, the
reserve outside the model, and the fraction of a device's memory a plan may fill.

Every check of whether a plan fits reads it: the launcher's pre-launch check
(``launcher/validate.py``), the estimators' memory model (``estimators.config.MemoryConfig``
defaults) and the reconfiguration cost's state movement (``engine/core/reconfig.py``); the
truth oracle's memory rule takes its bytes per parameter from here too.

- Model state per parameter (``state_bytes_per_param``): weights and gradients in the
  model's dtype, an fp32 master copy for 16-bit models, and the optimizer's fp32 state
  (Adam: two moments, 8 B; SGD: momentum, 4 B), the optimizer part divided by ``shard``
  when the update is sharded over data-parallel ranks. Adam, mixed precision:
  2 + 2 + 4 + 8 = 16 B; Adam, float32: 4 + 4 + 8 = 16 B (``ADAM_STATE_BYTES_PER_PARAM``).
- ``RUNTIME_RESERVE_BYTES``: memory a rank uses outside the model's tensors (CUDA context,
  allocator slack, workspaces, communication buffers).
- ``USABLE_MEMORY_FRACTION`` = 0.95: a plan fits when its largest rank's estimate is at
  most this fraction of the device's memory. 0.95 is the value the estimators' memory
  model was checked with (the Arena artifact's pure data-parallel memory table, see
  docs/estimators.md) and the one the scheduler decides with; the launcher's pre-launch
  check used 0.9 before, and so could refuse a plan the scheduler had placed.
- ``GRID_MEMORY_MARGIN``: a grid (not pure data parallelism) is kept only when its
  lowest-memory plan, times this margin, fits. 1.0 for the project's launcher (it runs
  the plan the planner chose and checks it with this same rule before launch; a launch
  that still runs out of memory marks the shape infeasible for the job).
  ``ARENA_GRID_MEMORY_MARGIN`` (``estimators.config.arena_runtime``) for the Arena
  artifact's runtime, whose plan search does not reach our lowest-memory plan (its
  out-of-memory runs need 27-65% of GPU memory in that plan): the largest margin under
  which every measured run of the Arena table still fits, widened by the largest excess
  one model's runs showed over every other model's (``estimators.evaluation.accuracy.
  choose_grid_margin``; cross-validated by held-out model there: no run that fitted is
  called infeasible, 5 of the 11 out-of-memory rows are; a test recomputes this value).
"""
from __future__ import annotations

from types import MappingProxyType

USABLE_MEMORY_FRACTION = 0.95
RUNTIME_RESERVE_BYTES = 1.0 * 2**30
GRID_MEMORY_MARGIN = 1.0
ARENA_GRID_MEMORY_MARGIN = 2.05          # choose_grid_margin on the table: 2.0587, rounded down
MASTER_WEIGHT_BYTES = 4                     # fp32 master copy of a 16-bit model's weights
OPTIMIZER_STATE_BYTES = MappingProxyType({"adam": 8, "sgd": 4})   # fp32 state per parameter
OPTIMIZERS = tuple(OPTIMIZER_STATE_BYTES)


def state_bytes_per_param(dtype_bytes: int, optimizer: str = "adam", shard: int = 1) -> float:
    """Weights + gradients + optimizer state bytes per parameter (the optimizer part, with
    the fp32 master copy of a 16-bit model, divided by ``shard``)."""
    master = MASTER_WEIGHT_BYTES if dtype_bytes < 4 else 0
    return 2 * dtype_bytes + (master + OPTIMIZER_STATE_BYTES[optimizer]) / max(1, shard)


ADAM_STATE_BYTES_PER_PARAM = state_bytes_per_param(2)      # 16.0 (float32 Adam: 16.0 too)
