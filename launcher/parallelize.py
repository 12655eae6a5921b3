"""Tensor and data parallelism applied to a plain model from outside, with torch's own
building blocks.

- Tensor: ``torch.distributed.tensor.parallel.parallelize_module`` with the Megatron
  split: query/key/value and the MLP's input linears column-wise, the attention output
  and the MLP's output linear row-wise (``tp_plan``, per model family; MoE experts each
  split like the dense MLP). Embeddings, norms and the output head stay replicated on
  the tensor ranks (their gradients agree because the column-parallel inputs are
  all-reduced in backward).
- Data: ``DistributedDataParallel`` on the data-parallel group for a plain model
  (tp = pp = 1); FSDP2 ``fully_shard`` on the data-parallel mesh dimension otherwise:
  DDP cannot wrap DTensor parameters (tp > 1), and DDP under torch's pipeline schedules
  fails in its bucket rebuilding with several micro-batches (an internal assert in
  reducer.cpp on torch 2.13), while FSDP2 is what the pipeline stage supports. Both
  average gradients over the data ranks.
- One rank's part, without a process group: ``tp_shard`` keeps, as plain linears, the
  slice of every projection that one tensor rank holds under ``apply_tp``. The estimators'
  profiler times that (the compute of one rank of the layer the launcher trains; the
  all-reduces ``apply_tp`` adds are profiled separately).
"""
from __future__ import annotations

from torch import nn

ATTENTION_TP = {"attn.wq": "colwise", "attn.wk": "colwise", "attn.wv": "colwise", "attn.wo": "rowwise"}
MLP_TP = {"gpt": {"fc1": "colwise", "fc2": "rowwise"},           # names inside the MLP module
          "llama": {"w1": "colwise", "w3": "colwise", "w2": "rowwise"}}


def tp_plan(arch) -> dict[str, str]:
    """Submodule name -> "colwise"/"rowwise" for one decoder layer of ``arch``. MoE: every
    expert's MLP is split like the dense GELU MLP (each tensor rank holds a slice of every
    expert); the router stays replicated."""
    fam = arch.base_family
    if fam == "moe":
        mlps = [(f"mlp.experts.{e}", MLP_TP["gpt"]) for e in range(arch.num_experts)]
    else:
        mlps = [("mlp", MLP_TP[fam])]
    return {**ATTENTION_TP, **{f"{prefix}.{name}": style for prefix, plan in mlps for name, style in plan.items()}}


def apply_tp(model: nn.Module, tp_mesh) -> nn.Module:
    """Shard every decoder layer's projections over ``tp_mesh`` (a 1-D device mesh)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = tp_plan(model.arch)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {name: styles[s]() for name, s in plan.items()})
    return model


def tp_shard(module: nn.Module, plan: dict[str, str], tp: int, rank: int = 0) -> nn.Module:
    """Replace (in place) every linear that ``plan`` names (``tp_plan``) by the part tensor
    rank ``rank`` of ``tp`` holds under ``apply_tp``: column-wise, its rows of the weight
    and of the bias (output features); row-wise, its columns of the weight (input
    features) and the whole bias. Plain ``nn.Linear`` modules with the same weights, no
    DTensor and no collectives: one rank's compute of the sharded layer."""
    import torch

    for name, style in plan.items():
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        old = getattr(parent, attr)
        weight = old.weight.detach().chunk(tp, dim=0 if style == "colwise" else 1)[rank]
        bias = None if old.bias is None else old.bias.detach()
        if bias is not None and style == "colwise":
            bias = bias.chunk(tp)[rank]
        new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                        dtype=weight.dtype)
        with torch.no_grad():
            new.weight.copy_(weight)
            if bias is not None:
                new.bias.copy_(bias)
        setattr(parent, attr, new)
    return module


def apply_dp(model: nn.Module, dp_mesh, *, use_fsdp: bool, device) -> nn.Module:
    """Wrap ``model`` for data parallelism over ``dp_mesh``; returns the module to train."""
    if use_fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [device.index] if device.type == "cuda" else None
    return DDP(model, process_group=dp_mesh.get_group(), device_ids=device_ids)


def unwrap(module: nn.Module) -> nn.Module:
    """The plain model inside a DDP wrapper (FSDP2 modifies the model in place)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return module.module if isinstance(module, DDP) else module
