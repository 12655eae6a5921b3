"""``arena bench policies --seeds``: the comparison once per seed, then each policy's
spread over the seeds and a paired JCT comparison against a baseline (the statistics:
engine/sim/seed_stats.py; one seed's comparison: engine/cli/commands/bench/policies.py, policy_runs.py)."""
from __future__ import annotations

import math

from ...jsonout import dumps
from .policy_runs import (
    POLICY_COLUMNS,
    add_jct_bound,
    build_workload,
    decided_with,
    policy_bench,
    policy_colour,
    workload_args,
)


def seed_list(seeds: str | None, baseline: str | None, labels: list[str]) -> list[int] | None:
    """``--seeds`` as a list (None without it), and ``--baseline`` checked against the
    policy labels (refusals name the fields ``seeds`` and ``baseline``)."""
    from engine.sim.seed_stats import parse_seeds
    from instances.errors import InputError
    if seeds is None:
        if baseline is not None:
            raise InputError("--baseline needs --seeds (it names the policy the others are compared with, "
                             "seed by seed)", field="baseline")
        return None
    try:
        out = parse_seeds(seeds)
    except ValueError as e:
        raise InputError(str(e), field="seeds") from None
    if baseline is not None and baseline not in labels:
        raise InputError(f"baseline {baseline!r} is not a benchmarked policy label; labels: "
                         f"{', '.join(labels)}", field="baseline")
    return out


def run_seeded_bench(args, o, log, comm) -> int:
    """``bench policies --seeds``: the whole comparison once per seed (each seed's runs in
    ``OUT/seed-S/``), then each policy's spread over the seeds and its paired JCT ratio
    against the baseline (engine/sim/seed_stats.py); ``o``: the command's ``PolicyBench``
    (``args``: the workload's and the performance model's shared flags)."""
    from pathlib import Path

    from engine.sim.seed_stats import aggregate, seeds_changed_nothing
    policies = list(o.names)
    seeds = o.seed_list
    baseline = o.baseline or policies[0]
    rank = comm.Get_rank() if comm is not None else 0
    workloads = {s: workload_args(args, s) for s in seeds}
    instances = {s: build_workload(w) for s, w in workloads.items()}     # every seed's workload before any run
    rows: list[dict] = []
    for i, s in enumerate(seeds):
        if log and rank == 0:
            log(f"seed {s} ({i + 1} of {len(seeds)})")
        out = Path(o.out) / f"seed-{s}" if o.out else None
        got = policy_bench(workloads[s], policies, o.options, o.rounds, not o.no_run_out, o.perf,
                           o.reconfig, s, out, log, comm, o.names, args.profile_store, args.perf_runtime)
        if got is None:
            continue
        add_jct_bound(got, instances[s], o.options)
        rows += [{**r, "seed": s} for r in got]
    if rank != 0:
        return 0
    agg = aggregate(rows, baseline)
    same = seeds_changed_nothing(rows)
    inst_name = instances[seeds[0]].name
    if o.out:
        write_seeded_outputs(rows, agg, o.out, inst_name, seeds, args.plugins)
    if o.json:
        print(dumps({"instance": inst_name, "seeds": seeds, "baseline": baseline,
                          "seeds_changed_nothing": same, "aggregate": agg, "rows": rows}, indent=2, default=str))
        return 0

    def ms(d, div=1.0, prec=0):
        if d["mean"] is None:
            return "-"
        return f"{d['mean'] / div:,.{prec}f} ± {d['sd'] / div:,.{prec}f}"

    print(f"{'policy':<18} {'seeds':>5} {'avg JCT run out, s':>20} {'makespan, s':>22} {'/bound':>12} "
          f"{'reconf/job':>12} {'never':>5} {'unfin':>5}  JCT gain vs {baseline} (geo mean [95% CI], wins)")
    for e in agg:
        g = e["jct_gain_vs_baseline"]
        if e["policy"] == baseline:
            gain = "(baseline)"
        elif g["geomean"] is None:
            gain = f"- (no seed where both finished every job; {g['seeds_incomparable']} incomparable)"
        else:
            ci = f" [{g['ci95'][0]:.3f}, {g['ci95'][1]:.3f}]" if g["ci95"] else ""
            gain = (f"{g['geomean']:.3f}x{ci}, {g['wins']}/{g['seeds_compared']}"
                    + (f" ({g['seeds_incomparable']} seeds incomparable)" if g["seeds_incomparable"] else ""))
        print(f"{e['policy']:<18} {e['seeds']:>5} {ms(e['avg_jct_runout_s']):>20} "
              f"{ms(e['makespan_runout_s']):>22} {ms(e['avg_jct_over_bound'], prec=2):>12} "
              f"{ms(e['reconfigurations_per_job_runout'], prec=2):>12} {e['jobs_never_placed_total']:>5} "
              f"{e['jobs_unfinished_runout_total']:>5}  {gain}")
    print(f"mean ± sd over {len(seeds)} seeds ({o.seeds}); never / unfin: jobs never placed / unfinished after "
          f"the run-out, summed over the seeds; JCT gain: {baseline}'s average JCT over the policy's, seed by seed, "
          f"counted only where both finished every job; decisions from {decided_with(rows)}")
    if same:
        print("the seeds changed nothing: every policy had the same JCT and makespan in every seed (a fixed trace "
              "decided without noise); the spread is zero, not measured")
    if o.out:
        print(f"wrote {o.out}/results.json, results.csv, aggregate.csv, comparison.png and seed-*/")
    return 0


def write_seeded_outputs(rows: list[dict], agg: list[dict], out_dir, instance_name: str, seeds: list[int],
                         plugins: tuple = ()) -> None:
    import csv
    from dataclasses import asdict
    from pathlib import Path

    from engine.sim.seed_stats import COUNTS, METRICS
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    doc = {"instance": instance_name, "seeds": seeds, "aggregate": agg, "rows": rows,
           "plugins": [asdict(p) for p in plugins]}
    (d / "results.json").write_text(dumps(doc, indent=2, default=str))
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["seed", *POLICY_COLUMNS], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(d / "aggregate.csv", "w", newline="") as f:
        w2 = csv.writer(f)
        stats = ("mean", "sd", "min", "max")
        w2.writerow(["policy", "seeds", *[f"{k}_{s}" for k in METRICS for s in stats],
                     *[f"{k}_total" for k in COUNTS], "baseline", "jct_gain_geomean", "jct_gain_ci95_low",
                     "jct_gain_ci95_high", "jct_gain_wins", "seeds_compared", "seeds_incomparable"])
        for e in agg:
            g = e["jct_gain_vs_baseline"]
            ci = g["ci95"] or [None, None]
            w2.writerow([e["policy"], e["seeds"], *[e[k][s] for k in METRICS for s in stats],
                         *[e[f"{k}_total"] for k in COUNTS], e["baseline"], g["geomean"], ci[0], ci[1],
                         g["wins"], g["seeds_compared"], g["seeds_incomparable"]])
    plot_seeded_comparison(agg, d / "comparison.png", instance_name, seeds)


def plot_seeded_comparison(agg: list[dict], path, instance_name: str, seeds: list[int]) -> None:
    """Mean ± sd over the seeds per policy, jobs never placed or unfinished (summed), and
    the paired JCT gain against the baseline with its 95% interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metrics = [("avg_jct_runout_s", "avg JCT, run out (h)", 3600.0),
               ("makespan_runout_s", "makespan, run out (h)", 3600.0),
               ("avg_jct_over_bound", "avg JCT over avg JCT alone at fastest", 1.0),
               ("reconfigurations_per_job_runout", "reconfigurations per job", 1.0),
               ("reconfig_gpu_hours_lost_runout", "GPU-hours lost to moves", 1.0)]
    fig, grid = plt.subplots(2, 4, figsize=(14, 7.5))
    axes = list(grid.flat)
    names = [e["policy"] for e in agg]
    x = list(range(len(agg)))
    colours = [policy_colour(e["policy_name"]) for e in agg]
    for ax, (key, title, div) in zip(axes, metrics):
        mean = [(e[key]["mean"] if e[key]["mean"] is not None else math.nan) / div for e in agg]
        sd = [(e[key]["sd"] or 0.0) / div for e in agg]
        ax.bar(x, mean, yerr=sd, capsize=3, color=colours)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax = axes[len(metrics)]
    never = [e["jobs_never_placed_total"] for e in agg]
    unfinished = [e["jobs_unfinished_runout_total"] for e in agg]
    ax.bar(x, never, color="tab:red", label="never placed")
    ax.bar(x, [u - n for u, n in zip(unfinished, never)], bottom=never, color="tab:orange",
           label="placed, unfinished")
    ax.set_ylim(0, max([1, *unfinished, *never]) * 1.1)
    ax.set_title("jobs not finished, summed over seeds", fontsize=9)
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    ax = axes[len(metrics) + 1]
    base = agg[0]["baseline"] if agg else ""
    g = [e["jct_gain_vs_baseline"] for e in agg]
    mid = [v["geomean"] if v["geomean"] is not None else math.nan for v in g]
    lo = [m - v["ci95"][0] if v["ci95"] else 0.0 for m, v in zip(mid, g)]
    hi = [v["ci95"][1] - m if v["ci95"] else 0.0 for m, v in zip(mid, g)]
    ax.bar(x, mid, yerr=[lo, hi], capsize=3, color=colours)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_title(f"JCT gain vs {base} (paired, 95% CI)", fontsize=9)
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    axes[-1].axis("off")
    fig.suptitle(f"policies on {instance_name} over {len(seeds)} seeds: mean ± sd", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
