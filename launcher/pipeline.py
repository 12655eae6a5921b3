"""Pipeline parallelism with ``torch.distributed.pipelining``: cut the plain model into
stages (manual split, one stage per pipeline rank) and drive them with torch's
``ScheduleGPipe`` or ``Schedule1F1B``.

A stage keeps its layers (decoder layers, Wide-ResNet blocks) under their global names
(``layers.<i>``), the first stage keeps the model's ``FIRST_STAGE`` modules (embeddings,
convolution stem), the last its ``LAST_STAGE`` ones (final norm and output head,
classifier); what a stage does not hold is deleted (set to ``None``), so parameter names
stay identical across plans.
"""
from __future__ import annotations

from typing import Callable

SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def stage_ranges(num_layers: int, pp: int, stage_layers: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """``[lo, hi)`` decoder-layer ranges of the ``pp`` stages: ``stage_layers`` if given,
    otherwise as even as possible with earlier stages taking the remainder."""
    if not stage_layers:
        base, extra = divmod(num_layers, pp)
        stage_layers = tuple(base + (1 if i < extra else 0) for i in range(pp))
    out, lo = [], 0
    for n in stage_layers:
        out.append((lo, lo + n))
        lo += n
    return out


def split_stage(model, stage_index: int, pp: int, stage_layers: tuple[int, ...] = ()):
    """Keep stage ``stage_index``'s part of ``model`` (in place) and return it."""
    if pp == 1:
        return model
    lo, hi = stage_ranges(len(model.layers), pp, stage_layers)[stage_index]
    for name in list(model.layers.keys()):
        if not lo <= int(name) < hi:
            del model.layers[name]
    if stage_index > 0:
        for name in model.FIRST_STAGE:
            setattr(model, name, None)
    if stage_index < pp - 1:
        for name in model.LAST_STAGE:
            setattr(model, name, None)
    return model


def build_schedule(stage_module, stage_index: int, pp: int, device, group, *, microbatches: int,
                   schedule: str, loss_fn: Callable):
    """The torch pipeline stage and schedule for this rank."""
    from torch.distributed import pipelining

    stage = pipelining.PipelineStage(stage_module, stage_index, pp, device, group=group)
    cls = getattr(pipelining, SCHEDULE_CLASSES[schedule])
    return cls(stage, n_microbatches=microbatches, loss_fn=loss_fn)
