"""Single-process reference training (no torch.distributed, no parallelism): the same
model initialisation, data and Adam as a launched run, the whole global batch per step.
Any plan's losses must match these within floating-point reordering tolerance."""
from __future__ import annotations

from .config import OptimizerConfig


def train_reference(model: str, *, steps: int, global_batch: int, seed: int = 0,
                    start_step: int = 0, optimizer: OptimizerConfig | None = None,
                    data_path: str | None = None) -> list[float]:
    """Losses of steps ``start_step + 1 .. steps`` of an uninterrupted run (the earlier
    steps are trained too, their losses are dropped)."""
    import torch

    from .data import make_source
    from .model import build_model, loss_fn

    torch.set_num_threads(1)
    opt_cfg = optimizer or OptimizerConfig()
    net = build_model(model, seed)
    opt = torch.optim.Adam(net.parameters(), lr=opt_cfg.lr, betas=(opt_cfg.beta1, opt_cfg.beta2),
                           eps=opt_cfg.eps)
    data = make_source(net.arch, seed, data_path)
    losses = []
    for step in range(steps):
        x, y = data.global_batch(step, global_batch)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        if step >= start_step:
            losses.append(float(loss.detach()))
    return losses
