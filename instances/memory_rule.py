"""The project's one memory rule: the bytes a training job keeps per parameter, the
reserve outside the model, and the fraction of a device's memory a plan may fill.

Every check of whether a plan fits reads it: the launcher's pre-launch check
(``launcher/validate.py``), the estimators' memory model (``estimators.config.MemoryConfig``
defaults) and the reconfiguration cost's state movement (``engine/reconfig.py``); the
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
"""
from __future__ import annotations

from types import MappingProxyType

USABLE_MEMORY_FRACTION = 0.95
RUNTIME_RESERVE_BYTES = 1.0 * 2**30
MASTER_WEIGHT_BYTES = 4                     # fp32 master copy of a 16-bit model's weights
OPTIMIZER_STATE_BYTES = MappingProxyType({"adam": 8, "sgd": 4})   # fp32 state per parameter
OPTIMIZERS = tuple(OPTIMIZER_STATE_BYTES)


def state_bytes_per_param(dtype_bytes: int, optimizer: str = "adam", shard: int = 1) -> float:
    """Weights + gradients + optimizer state bytes per parameter (the optimizer part, with
    the fp32 master copy of a 16-bit model, divided by ``shard``)."""
    master = MASTER_WEIGHT_BYTES if dtype_bytes < 4 else 0
    return 2 * dtype_bytes + (master + OPTIMIZER_STATE_BYTES[optimizer]) / max(1, shard)


ADAM_STATE_BYTES_PER_PARAM = state_bytes_per_param(2)      # 16.0 (float32 Adam: 16.0 too)
