"""`arena bench bound`: how far simulated schedules are from every job running alone at its fastest.

    arena bench bound --instance arena-philly [--max-gpus 16] [RUN_DIR ...] [--json]
    arena bench bound --cluster C.json --trace T.csv [RUN_DIR ...]

Computes each job's JCT lower bound (``instances/bounds.py``: the job alone on the
cluster, from the first round after its arrival, on its truly fastest shape of at most
``--max-gpus`` GPUs or its requested one, no queueing or launch cost) and prints the
average. For each ``RUN_DIR`` (an ``arena simulate --run-out --out`` directory of the
same workload: its ``jobs.csv``, whose jobs must be the workload's -- ids, models,
batches, iterations, arrivals and requests; ``WORK_FIELDS``) it prints the average JCT over all jobs, its ratio to
the average bound, and the same split by the bound's length (under an hour, up to a
day, up to ten days, longer): each class's share of the average JCT, so that two
policies' difference can be read class by class. A run with unfinished jobs has no
average over all jobs; it is reported as such. Progress on stderr; ``--json`` prints
only JSON on stdout.
"""
from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from instances.errors import InputError
from instances.limits import check_time

from ...common import seed_arg
from ...flags import add_config_flags, config_flags, config_values, fields_as_flags
from ...jsonout import dumps

CLASSES = ((0.0, 3600.0, "< 1 h"), (3600.0, 86400.0, "1 h - 1 d"), (86400.0, 864000.0, "1 d - 10 d"),
           (864000.0, math.inf, "> 10 d"))


# What defines a job's work (and its bound), as jobs.csv writes it: a run whose jobs differ
# in any of these from the workload's is a run of another workload, whatever its job ids.
WORK_FIELDS = ("model", "global_batch", "num_iterations", "arrival_s", "requested_gpu_type", "requested_gpus")


def _same(field: str, written: str, value) -> bool:
    if value is None:
        return written == ""
    if field == "arrival_s":
        try:
            return math.isclose(float(written), value, rel_tol=1e-9, abs_tol=1e-6)
        except ValueError:
            return False
    return written == str(value)


def read_run(path: Path, jobs: dict) -> dict[str, float | None]:
    """job id -> JCT (None: unfinished) from a run directory's jobs.csv; an ``InputError``
    naming the file, the job and the field when the run's jobs are not ``jobs`` (id -> Job):
    other ids, or another model, batch, iteration count, arrival or request."""
    f = path / "jobs.csv"
    if not f.is_file():
        raise InputError("no jobs.csv here (an `arena simulate --out` directory?)", file=str(path))
    out: dict[str, float | None] = {}
    with f.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("job_id", "status", "jct_s", *WORK_FIELDS) if c not in (reader.fieldnames or ())]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)} (not a jobs.csv of `arena simulate`)",
                             file=str(f), line=1, field=missing[0])
        for i, row in enumerate(reader, start=2):
            try:
                jid, jct = row["job_id"], row["jct_s"]
                out[jid] = float(jct) if jct not in ("", None) and row.get("status") == "finished" else None
            except (KeyError, ValueError, TypeError) as e:
                raise InputError(f"bad row: {e}", file=str(f), line=i) from None
            if out[jid] is not None:        # a finished job's JCT: a time (nan or inf printed `nan nanx`)
                check_time(out[jid], file=str(f), line=i, field="jct_s", what=f"job {jid!r}: ")
            job = jobs.get(jid)
            if job is None:
                continue                    # (counted below)
            for field in WORK_FIELDS:
                value = getattr(job, field)
                if not _same(field, row[field] or "", value):
                    raise InputError(f"not a run of this workload: job {jid!r} has {field} {row[field] or 'none'} in "
                                     f"this run, {'none' if value is None else value} in the workload", file=str(f),
                                     line=i, field=field)
    if set(out) != set(jobs):
        missing_jobs, extra = len(set(jobs) - set(out)), len(set(out) - set(jobs))
        raise InputError(f"not a run of this workload: {missing_jobs} of its jobs missing, {extra} unknown",
                         file=str(f))
    return out


def report(bounds, runs: dict[str, dict[str, float | None]], max_gpus: int) -> dict:
    finite = [b for b in bounds if math.isfinite(b.bound_s)]
    n = len(bounds)
    out: dict = {"jobs": n, "max_gpus": max_gpus, "jobs_without_shape": n - len(finite),
                 "avg_bound_s": sum(b.bound_s for b in finite) / len(finite) if finite else None,
                 "classes": [], "runs": {}}
    cls_of = {}
    for b in bounds:
        cls_of[b.job_id] = next((name for lo, hi, name in CLASSES if lo <= b.bound_s < hi), None)
    for lo, hi, name in CLASSES:
        members = [b for b in finite if lo <= b.bound_s < hi]
        out["classes"].append({"class": name, "jobs": len(members),
                               "bound_share_s": sum(b.bound_s for b in members) / n})
    for label, jct in runs.items():
        unfinished = sum(1 for v in jct.values() if v is None)
        r: dict = {"unfinished": unfinished}
        if unfinished == 0:
            r["avg_jct_s"] = sum(v for v in jct.values() if v is not None) / n
            r["ratio_to_bound"] = r["avg_jct_s"] / out["avg_bound_s"] if out["avg_bound_s"] else None
            r["class_share_s"] = {name: sum(v for j, v in jct.items() if cls_of[j] == name and v is not None) / n
                                  for _, _, name in CLASSES}
        out["runs"][label] = r
    return out


def print_report(name: str, rep: dict) -> None:
    if rep["avg_bound_s"] is None:
        print(f"{name}: {rep['jobs']:,} jobs; none fits any shape of <= {rep['max_gpus']} GPUs: no bound")
        return
    print(f"{name}: {rep['jobs']:,} jobs; JCT lower bound (alone, fastest shape of <= {rep['max_gpus']} GPUs "
          f"or as requested): average {rep['avg_bound_s']:,.0f} s"
          + (f"; {rep['jobs_without_shape']} job(s) fit no shape" if rep["jobs_without_shape"] else ""))
    runs = rep["runs"]
    if not runs:
        return
    print(f"\n{'run':<40} {'avg JCT s':>12} {'/ bound':>8}")
    for label, r in runs.items():
        if r["unfinished"]:
            print(f"{label:<40} {'n/a':>12} {'':>8}  ({r['unfinished']} unfinished: no average over all jobs)")
        else:
            print(f"{label:<40} {r['avg_jct_s']:>12,.0f} {r['ratio_to_bound']:>7.2f}x")
    done = [label for label, r in runs.items() if not r["unfinished"]]
    if not done:
        return
    print("\nshare of the average JCT over all jobs (s) by the bound's length, and its ratio to the bound's share:")
    names = [Path(label).name or label for label in done]
    width = max(20, *(len(x) for x in names))
    print(f"{'class':<12} {'jobs':>6} {'bound':>10}" + "".join(f"  {x:>{width}}" for x in names))
    for c in rep["classes"]:
        row = f"{c['class']:<12} {c['jobs']:>6} {c['bound_share_s']:>10,.0f}"
        for label in done:
            v = runs[label]["class_share_s"][c["class"]]
            cell = f"{v:,.0f} ({v / c['bound_share_s']:.2f}x)" if c["bound_share_s"] else f"{v:,.0f}"
            row += f"  {cell:>{width}}"
        print(row)


@dataclass(frozen=True)
class BoundBench:
    """``arena bench bound``'s own options (beside its run folders and the workload's
    flags, which ``build_instance`` reads), validated; each field carries its flag
    (engine/cli/flags.py)."""
    max_gpus: int = field(default=16, metadata={
        "flag": "--max-gpus", "help": "largest GPU count a job may get (default %(default)s, the policies' max_gpus)"})
    json: bool = field(default=False, metadata={"flag": "--json", "help": "print JSON instead of tables"})
    plot: str | None = field(default=None, metadata={
        "flag": "--plot", "metavar": "PNG",
        "help": "also draw each run's JCT over the bound, per class of job length, to this PNG file"})

    def __post_init__(self):
        from instances.cluster import MAX_CLUSTER_GPUS
        from instances.limits import show_number
        if not 1 <= self.max_gpus <= MAX_CLUSTER_GPUS:
            raise InputError(f"must be in 1..{MAX_CLUSTER_GPUS:,} (the GPUs a cluster may have), got "
                             f"{show_number(self.max_gpus)}", field="max_gpus")


BOUND_BENCH_FLAGS = config_flags(BoundBench)


def register(sub) -> None:
    """``arena bench bound`` (registered by ``engine/cli/commands/bench/__init__.py``)."""
    b = sub.add_parser("bound", help="average JCT of simulated runs against every job alone at its fastest",
                       description=__doc__.split("\n\n")[0])
    b.add_argument("runs", nargs="*", metavar="RUN_DIR", help="`arena simulate --out` directories of this workload")
    from ...common import add_workload_args
    add_workload_args(b)
    b.add_argument("--seed", type=seed_arg, default=0, help="instance seed (default 0)")    # (the workload's)
    add_config_flags(b, BoundBench)
    b.set_defaults(func=run_bound_bench)


def run_bound_bench(args) -> int:
    from instances.bounds import jct_lower_bounds

    from ...common import build_instance
    with fields_as_flags(BOUND_BENCH_FLAGS):
        o = BoundBench(**config_values(args, BoundBench))
    if o.plot:
        from instances.paths import check_output_file
        check_output_file(o.plot, BOUND_BENCH_FLAGS["plot"])
    inst = build_instance(args)
    by_id = {j.job_id: j for j in inst.jobs}
    runs = {r: read_run(Path(r), by_id) for r in args.runs}       # (checked before the bounds' work)
    print(f"bounds of {len(inst.jobs):,} jobs ...", file=sys.stderr, flush=True)
    bounds = jct_lower_bounds(inst.jobs, inst.cluster, inst.oracle, round_interval_s=inst.round_interval_s,
                              max_gpus=o.max_gpus)
    rep = report(bounds, runs, o.max_gpus)
    if o.json:
        print(dumps({"instance": inst.name, **rep}))
    else:
        print_report(inst.name, rep)
    if o.plot:
        plot_report(inst.name, rep, o.plot)
        print(f"wrote {o.plot}", file=sys.stderr)
    return 0


def plot_report(name: str, rep: dict, path) -> None:
    """Grouped bars: per class of job length (and over all jobs), each finished run's
    share of the average JCT over the bound's share."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {label: r for label, r in rep["runs"].items() if not r["unfinished"]}
    classes = [c for c in rep["classes"] if c["bound_share_s"]]
    groups = [f"{c['class']}\n({c['jobs']} jobs)" for c in classes] + [f"all jobs\n({rep['jobs']})"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * max(1, len(runs)) / 2), 4))
    width = 0.8 / max(1, len(runs))
    for k, (label, r) in enumerate(runs.items()):
        vals = [r["class_share_s"][c["class"]] / c["bound_share_s"] for c in classes] + [r["ratio_to_bound"]]
        xs = [i + (k - (len(runs) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, vals, width, label=Path(label).name or label)
        for b, v in zip(bars, vals):
            ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=6)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel("JCT over the bound (1 = alone at fastest)")
    ax.set_title(f"{name}: average JCT over each job's JCT alone at its fastest shape "
                 f"(<= {rep['max_gpus']} GPUs), by job length", fontsize=9)
    if runs:
        ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    from instances.paths import write_output
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    write_output(path, png.getvalue(), BOUND_BENCH_FLAGS["plot"])     # (/dev/full: said, not "wrote")
