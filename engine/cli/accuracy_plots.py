"""PNG plots of the estimator accuracy report against the Arena measured table
(``estimators.evaluation.accuracy.against_arena``): estimated vs measured per row, and the error
per GPU count for the analytic model and the three learned regimes."""
from __future__ import annotations

from pathlib import Path

ACCURACY_PLOT_FILES = ("accuracy_scatter.png", "accuracy_by_gpus.png")
REGIMES = (("analytic", "analytic (in-sample constants)"), ("gpu_type", "learned, new GPU type"),
           ("model", "learned, new models"), ("row", "learned, new rows"))


def _error(entry: dict, regime: str) -> float | None:
    return entry["analytic"] if regime == "analytic" else entry["learned"][regime]


def write_accuracy_plots(report: dict, out_dir) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = report["row_errors"]
    types = sorted({r["gpu_type"] for r in rows})
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharex=True, sharey=True)
    lo = min(r["measured_s"] for r in rows) * 0.7
    hi = max(r["measured_s"] for r in rows) * 1.4
    line = np.array([lo, hi])
    for ax, regime in zip(axes, ("analytic", "gpu_type")):
        for t in types:
            pts = [(r["measured_s"], r["measured_s"] * (1 + _error(r, regime))) for r in rows
                   if r["gpu_type"] == t and _error(r, regime) is not None]
            if pts:
                m, e = zip(*pts)
                ax.scatter(m, e, s=12, alpha=0.7, label=t)
        ax.plot(line, line, "k-", lw=0.8)
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="±10%")
        errs = [abs(_error(r, regime)) for r in rows if _error(r, regime) is not None]
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured iteration time (s)",
               ylabel="estimated iteration time (s)",
               title=f"{dict(REGIMES)[regime]}: MAPE {100 * np.mean(errs):.1f}%")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    paths.append(out / ACCURACY_PLOT_FILES[0])
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    counts = sorted({r["num_nodes"] * r["gpus_per_node"] for r in rows})
    width = 0.8 / len(REGIMES)
    for k, (regime, label) in enumerate(REGIMES):
        mape = []
        for n in counts:
            errs = [abs(_error(r, regime)) for r in rows
                    if r["num_nodes"] * r["gpus_per_node"] == n and _error(r, regime) is not None]
            mape.append(100 * np.mean(errs) if errs else np.nan)
        ax.bar(np.arange(len(counts)) + (k - (len(REGIMES) - 1) / 2) * width, mape, width, label=label)
    ax.axhline(10, color="k", lw=0.8, ls="--", label="10% target")
    ax.set(xticks=np.arange(len(counts)), xticklabels=[str(n) for n in counts], xlabel="GPUs",
           ylabel="MAPE (%)", title="Error vs the Arena measured table, per GPU count")
    ax.legend(fontsize=8); ax.grid(alpha=0.3, axis="y")
    paths.append(out / ACCURACY_PLOT_FILES[1])
    fig.tight_layout(); fig.savefig(paths[-1], dpi=100); plt.close(fig)
    return paths
