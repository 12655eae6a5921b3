"""PNG plots of one simulation (matplotlib, Agg backend): JCT CDF, throughput over time,
GPU utilization by type, queue length, and the move ledger (expected against realized
gain of every move, how long a job stayed where a move put it), and with a shadow policy
where it parted ways with the policy that decided."""
from __future__ import annotations

from pathlib import Path

PLOT_FILES = ("jct_cdf.png", "throughput.png", "gpu_util.png", "queue_length.png", "moves.png")
SHADOW_PLOT = "shadow.png"      # with a shadow policy only (engine/core/shadow.py)


def write_plots(result, out_dir) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{result.instance_name} / {result.policy_name}"
    rounds = result.rounds
    t0 = rounds[0].time_s if rounds else 0.0
    hours = np.array([(r.time_s - t0) / 3600.0 for r in rounds])
    interval = result.summary.get("round_interval_s", 300.0)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    jct = np.sort([j.jct_s for j in result.jobs if j.jct_s is not None])
    if len(jct):
        ax.step(jct / 3600.0, np.arange(1, len(jct) + 1) / len(jct), where="post")
    ax.set(xlabel="JCT (hours)", ylabel="fraction of finished jobs", title=f"JCT CDF — {title}")
    ax.grid(alpha=0.3)
    paths.append(out / PLOT_FILES[0])
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(hours, [r.throughput_samples_per_s for r in rounds], lw=0.8)
    ax.set(xlabel="time (hours)", ylabel="samples / s", title=f"Cluster throughput — {title}")
    ax.grid(alpha=0.3)
    paths.append(out / PLOT_FILES[1])
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    gpus = _gpus_by_type(result)
    types = sorted(gpus)
    for t in types:
        n = gpus.get(t)
        if n:
            ax.plot(hours, [r.gpu_busy_s.get(t, 0.0) / (n * interval) for r in rounds], lw=0.8, label=t)
    total = sum(gpus.values())
    if total and any(r.gpus_out for r in rounds):       # nodes out of service (--outages)
        ax.plot(hours, [1.0 - r.gpus_out / total for r in rounds], lw=0.8, ls="--", color="k",
                label="GPUs in service")
    ax.set(xlabel="time (hours)", ylabel="GPUs held / GPUs", ylim=(0, 1.05), title=f"GPU utilization — {title}")
    ax.legend(fontsize=8); ax.grid(alpha=0.3)
    paths.append(out / PLOT_FILES[2])
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(hours, [r.queued for r in rounds], lw=0.8, label="queued")
    ax.plot(hours, [r.running for r in rounds], lw=0.8, label="running")
    ax.set(xlabel="time (hours)", ylabel="jobs", title=f"Queue length — {title}")
    ax.legend(fontsize=8); ax.grid(alpha=0.3)
    paths.append(out / PLOT_FILES[3])
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)

    paths.append(out / PLOT_FILES[4])
    _plot_moves(plt, np, result.moves, title, paths[-1])
    compared = [r for r in rounds if r.shadow is not None]
    if compared:
        paths.append(out / SHADOW_PLOT)
        _plot_shadow(plt, np, compared, t0, title, paths[-1])
    return paths


def _plot_shadow(plt, np, compared, t0: float, title: str, path) -> None:
    """Left: per round, the share of jobs the shadow policy gives the same grid (x: time);
    right: running jobs moved or stopped so far, by the decisions and by the shadow's."""
    ok = [r for r in compared if r.shadow.error is None]
    name = compared[0].shadow.policy
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    h = np.array([(r.time_s - t0) / 3600.0 for r in ok])
    if len(ok):
        ax.scatter(h, [r.shadow.agree / r.shadow.jobs for r in ok], s=6, alpha=0.6)
        bx.step(h, np.cumsum([r.shadow.changes[0] for r in ok]), where="post", label="decided")
        bx.step(h, np.cumsum([r.shadow.changes[1] for r in ok]), where="post", label=f"{name} (shadow)")
        bx.legend(fontsize=8)
    failed = len(compared) - len(ok)
    ax.set(xlabel="time (hours)", ylabel="jobs given the same grid / active jobs", ylim=(-0.05, 1.05),
           title=f"Shadow {name}{f' ({failed} rounds failed)' if failed else ''} — {title}")
    bx.set(xlabel="time (hours)", ylabel="running jobs moved or stopped, cumulative")
    ax.grid(alpha=0.3); bx.grid(alpha=0.3)
    fig.tight_layout(); fig.savefig(path, dpi=100); plt.close(fig)


def _plot_moves(plt, np, moves, title: str, path) -> None:
    """Left: each decided move's expected gain (the model's) against its realized gain
    (measured, downtime included), by whether it paid for itself; right: how long each
    move's job stayed where it put it."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    judged = [m for m in moves if not m.forced and m.est_gain and m.realized_gain]
    groups = (("paid for itself", "tab:green", lambda m: m.est_gain > 1 and m.paid_back),
              ("did not", "tab:red", lambda m: m.est_gain > 1 and not m.paid_back),
              ("gave way (expected slower)", "tab:gray", lambda m: m.est_gain <= 1))
    for label, colour, keep in groups:
        pts = [(m.est_gain, m.realized_gain) for m in judged if keep(m)]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=6, alpha=0.5, color=colour, label=f"{label} ({len(pts)})")
    if judged:
        lo = min(min(m.est_gain, m.realized_gain) for m in judged)
        hi = max(max(m.est_gain, m.realized_gain) for m in judged)
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.6)
        ax.set(xscale="log", yscale="log")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no measured moves", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="expected gain (new grid / old, estimate)", ylabel="realized rate / rate before",
           title=f"Moves — {title}")
    ax.grid(alpha=0.3)
    stay = np.array([m.elapsed_s / 3600.0 for m in moves if m.elapsed_s and m.elapsed_s > 0])
    if len(stay):
        bins = np.logspace(np.log10(stay.min()), np.log10(stay.max()) + 1e-9, 30)
        bx.hist(stay, bins=bins, color="tab:blue")
        bx.set(xscale="log")
    else:
        bx.text(0.5, 0.5, "no moves", ha="center", va="center", transform=bx.transAxes)
    bx.set(xlabel="hours on the grid a move chose (until the next change or the end)", ylabel="moves")
    bx.grid(alpha=0.3)
    fig.tight_layout(); fig.savefig(path, dpi=100); plt.close(fig)


def _gpus_by_type(result) -> dict[str, int]:
    return result.gpus_by_type
