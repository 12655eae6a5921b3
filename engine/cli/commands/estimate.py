"""`arena estimate`: grids, proxy plans and estimates of a job; estimator accuracy and
proxy-plan quality.

    arena estimate --model gpt__1.3B --gpu-type a100 --gpus 8 --batch 256
    arena estimate accuracy --against arena-measured [--json]
    arena estimate accuracy --against local [--json]
    arena estimate proxy-quality [--json]
    arena estimate fit [--out PATH]      # the learned model policies decide with by default
"""
from __future__ import annotations

import math
import sys

from ..common import check_batch, seed_arg
from ..flags import fields_as_flags
from ..jsonout import dumps

ACTIONS = ("grids", "accuracy", "proxy-quality", "fit")
# the flag behind each field the grids action's job, cluster and performance model refuse
ESTIMATE_FLAGS = {"model": "--model", "gpu_type": "--gpu-type", "global_batch": "--batch", "num_nodes": "--gpus",
                  "gpus_per_node": "--gpus-per-node", "kind": "--perf", "link_load": "--link-load"}
# the performance-model kinds that take other jobs' load on the shared links
LINK_LOAD_KINDS = ("analytic", "learned")
# Exit status when the request is valid but no grid can run it (no plan, or none fits in
# memory): the table is still printed, the reason is on stderr; a bad input exits 2.
NO_GRID_EXIT = 1


def register(subparsers) -> None:
    p = subparsers.add_parser("estimate", help="estimate a job's grids; estimator accuracy; proxy quality",
                              description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", default="grids", choices=ACTIONS,
                   help="grids (default): a job's grids and proxy plans; accuracy: estimator error; "
                        "proxy-quality: proxy plan vs exhaustive search; fit: fit the learned model on the "
                        "measured table and save it where policies find it by default")
    p.add_argument("--model", help="catalog model, e.g. gpt__1.3B, or a Hugging Face-style config.json")
    p.add_argument("--gpu-type", help="GPU type, e.g. a100, v100, a40, a10")
    p.add_argument("--gpus", type=int, help="GPU count")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="node size (default: the catalog's for that type)")
    p.add_argument("--batch", type=int, default=256, help="global batch (samples per iteration)")
    p.add_argument("--perf", default="analytic", help="performance model kind: analytic, learned, learned-level, table")
    p.add_argument("--profile-store", default=None, metavar="DIR",
                   help="grids: take the profiled device's layer and collective times from this store "
                        "(`arena profile` fills it; default: catalog specs)")
    p.add_argument("--dp-only", action="store_true", help="pure data parallelism (baselines' view)")
    p.add_argument("--link-load", type=float, default=0.0, help="other jobs' load on shared links (fraction)")
    p.add_argument("--against", choices=("arena-measured", "local"), default="arena-measured",
                   help="accuracy: Arena's measured GPU table (default) or real torch runs here")
    p.add_argument("--store", default=None, help="profile store for --against local (default: a temporary "
                   "one, profiled just before the runs)")
    p.add_argument("--passes", type=int, default=3,
                   help="--against local: passes, each profiling afresh and running every plan")
    p.add_argument("--seed", type=seed_arg, default=0, help="cross-validation folds' seed (default 0)")
    p.add_argument("--max-splits", type=int, default=200, help="proxy-quality: exhaustive split limit per grid")
    p.add_argument("--refit-analytic", action="store_true",
                   help="accuracy: also refit the analytic constants in-sample and out of sample, with the "
                        "learned model on top of each fold's constants (slow: minutes per fold)")
    p.add_argument("--refit-regimes", nargs="+", choices=("gpu_type", "model", "row"), default=["gpu_type"],
                   help="folds of the refit: new GPU type (4 folds), new models or new rows (5 folds each)")
    p.add_argument("--refit-evals", type=int, default=120, help="Powell evaluations per refit start")
    p.add_argument("--refit-starts", type=int, default=2,
                   help="Powell runs per refit, from the best of the neutral and the corner starts")
    p.add_argument("--few-shot", action="store_true",
                   help="accuracy --against arena-measured: also the new-GPU-type curve with 0/8/16/32 rows of "
                        "that type's telemetry in training (~30 s more)")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="accuracy --against arena-measured: write estimated-vs-measured and per-GPU-count "
                        "error plots (PNG) to DIR")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="fit: where to save the learned model (default $ARENA_LEARNED_ARTIFACT, else "
                        "~/.cache/arena/learned.joblib)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run, estimate_defaults={a.dest: a.default for a in p._actions if a.option_strings})


# The options each action reads; another one given is refused, not silently passed over.
READS = {
    "grids": {"model", "gpu_type", "gpus", "gpus_per_node", "batch", "perf", "profile_store", "dp_only", "link_load"},
    "accuracy": {"against", "seed", "refit_analytic", "refit_regimes", "refit_evals", "refit_starts", "few_shot",
                 "plot"},
    "accuracy --against local": {"against", "passes", "store", "model"},
    "proxy-quality": {"model", "batch", "max_splits"},
    "fit": {"out", "seed"},
}


def check_options_read(args) -> None:
    """An option the action does not read (``--passes`` with the grids action) is an
    ``InputError`` naming it and the actions that read it."""
    from instances.errors import InputError
    key = "accuracy --against local" if args.action == "accuracy" and args.against == "local" else args.action
    for dest, default in getattr(args, "estimate_defaults", {}).items():
        if dest in READS[key] or dest in ("json", "help") or getattr(args, dest, default) == default:
            continue
        readers = [a for a, reads in READS.items() if dest in reads]
        if "accuracy" in readers and "accuracy --against local" in readers:
            readers.remove("accuracy --against local")
        raise InputError(f"the {key} action does not read it (it is for {' and '.join(readers)})",
                         field=f"--{dest.replace('_', '-')}")


def run(args) -> int:
    check_options_read(args)
    if args.action == "accuracy":
        return _accuracy(args)
    if args.action == "proxy-quality":
        return _proxy_quality(args)
    if args.action == "fit":
        return _fit(args)
    return _grids(args)


def _fit(args) -> int:
    import stat
    import time
    from pathlib import Path

    from estimators import make_performance_model
    from estimators.perf import learned_artifact_path
    from instances.errors import InputError
    from instances.paths import check_output_file, stat_path
    out = Path(args.out) if args.out else learned_artifact_path()
    st = stat_path(out, "--out")                            # before minutes of fitting
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder; give the artifact's file name", file=str(out), field="--out")
    # (a pipe waited and /dev/full failed, after the fit)
    check_output_file(out, "--out", regular="the artifact is a file that policies load")
    print("fitting the learned model on the measured table (minutes) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    model = make_performance_model("learned", seed=args.seed)
    path = model.save(out, "--out")
    info = {"artifact": str(path), "correction": model.chosen, "selection_cv_mape": model.selection,
            "fit_s": round(time.perf_counter() - t0, 1)}
    print(dumps(info) if args.json else f"saved {path} (correction {model.chosen}, {info['fit_s']} s)")
    return 0


def _grids(args) -> int:
    from estimators import make_performance_model
    from estimators.grids import candidate_grids
    from estimators.layers import max_useful_tp
    from instances.cluster import MAX_CLUSTER_GPUS, ClusterSpec, NodeGroup
    from instances.errors import InputError
    from instances.gpus import get_gpu
    from instances.jobs import Job
    from instances.limits import show_number
    for f in ("model", "gpu_type", "gpus"):
        if getattr(args, f) is None:
            flag = f"--{f.replace('_', '-')}"
            raise InputError(f"{flag} is required", field=flag)
    for flag, v in (("--gpus", args.gpus), ("--gpus-per-node", args.gpus_per_node)):
        if v is not None and not 1 <= v <= MAX_CLUSTER_GPUS:   # (10^22 GPUs overflowed a float)
            raise InputError(f"must be in 1..{MAX_CLUSTER_GPUS:,} (the GPUs a cluster may have), got "
                             f"{show_number(v)}", field=flag)
    check_batch(args.batch)
    with fields_as_flags(ESTIMATE_FLAGS):
        gpu = get_gpu(args.gpu_type)
        gpn = args.gpus_per_node or gpu.default_gpus_per_node
        cluster = ClusterSpec((NodeGroup(gpu.name, max(1, math.ceil(args.gpus / 1)), gpn),), "estimate")
        job = Job("estimate", args.model, args.batch, 1, 0.0)
        config = {"dp_only": args.dp_only}
        if args.perf in LINK_LOAD_KINDS:
            config["link_load"] = args.link_load
        if args.profile_store is not None:
            from estimators.perf import open_profile_store
            config["profile_store"] = open_profile_store(args.profile_store, "--profile-store")
        perf = make_performance_model(args.perf, **config)
    if args.link_load != 0 and args.perf not in LINK_LOAD_KINDS:       # (passed over without a word before)
        raise InputError(f"--perf {args.perf} does not read it; the link load is a feature of "
                         f"{' and '.join(LINK_LOAD_KINDS)} only", field="--link-load")
    grids = candidate_grids(job, cluster, gpu_counts=[args.gpus], dp_only=args.dp_only, prune=False)
    rows = []
    for g in grids:
        e = perf.estimate(job, g)
        p = e.plan
        rows.append({"grid": str(g), "feasible": e.feasible, "iteration_time_s": e.iteration_time_s,
                     "throughput": e.throughput, "peak_memory_gib": e.peak_memory_bytes / 2**30,
                     "plan": None if p is None else {"pp": p.pp, "dp": p.dp, "tp": p.tp,
                                                     "stage_layers": list(p.stage_layers),
                                                     "microbatches": p.microbatches, "schedule": p.schedule},
                     "source": e.source, "notes": list(e.notes)})
    fits = any(r["feasible"] for r in rows)
    if not rows:
        tp_cap = min(perf.planner.cfg.planner.max_tp, max_useful_tp(job.arch)) if hasattr(perf, "planner") else None
        print(f"arena estimate: no grid: every plan on {args.gpus} GPUs would have more data-parallel "
              f"replicas than the batch's {args.batch} samples (the planner keeps dp <= batch"
              + (f"; tensor degree at most {tp_cap}" if tp_cap else "") + ")", file=sys.stderr)
    if args.json:
        print(dumps({"model": job.model, "batch": args.batch, "seq_len": job.arch.seq_len, "gpu_type": gpu.name,
                          "gpus": args.gpus, "perf": perf.name, "grids": rows}, indent=1, default=str))
    elif rows:
        print(f"{job.model}, batch {args.batch} of {job.arch.seq_len}-token sequences, {args.gpus} x {gpu.name} "
              f"({gpn} per node), perf model {perf.name}")
        print(f"{'grid':<24} {'fits':<5} {'iter s':>9} {'samples/s':>10} {'mem GiB':>8}  plan")
        for r in sorted(rows, key=lambda r: (not r["feasible"], r["iteration_time_s"])):
            p = r["plan"]
            plan = "-" if p is None else (f"dp{p['dp']} tp{p['tp']} pp{p['pp']} m{p['microbatches']} "
                                          f"{p['schedule']} stages {p['stage_layers']}")
            print(f"{r['grid']:<24} {'yes' if r['feasible'] else 'NO':<5} {r['iteration_time_s']:>9.3f} "
                  f"{r['throughput']:>10.2f} {r['peak_memory_gib']:>8.1f}  {plan}")
        print(f"source: {rows[0]['source']}; " + "; ".join(rows[0]["notes"][:1]))
    if rows and not fits:
        hint = (f"; the sequence length comes from {job.arch.source}: add \"seq_length\" to that file to train "
                "shorter sequences" if job.arch.source else "")
        print(f"arena estimate: no grid fits in memory at {job.arch.seq_len}-token sequences and batch "
              f"{args.batch}{hint}", file=sys.stderr)
    return 0 if fits else NO_GRID_EXIT


def _fmt(x) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def _accuracy(args) -> int:
    from instances.errors import InputError
    if not args.refit_analytic:                 # (passed over without a word before)
        for dest in ("refit_evals", "refit_starts", "refit_regimes"):
            if getattr(args, dest) != args.estimate_defaults[dest]:
                raise InputError("is read only with --refit-analytic", field=f"--{dest.replace('_', '-')}")
    if args.refit_analytic:                                     # before a minute of work
        from instances.limits import MAX_REFIT_EVALS, show_number
        if not 1 <= args.refit_evals <= MAX_REFIT_EVALS:
            raise InputError(f"must be in 1..{MAX_REFIT_EVALS:,}, got {show_number(args.refit_evals)}",
                             field="--refit-evals")
        from estimators.evaluation.calibrate import max_starts
        if not 1 <= args.refit_starts <= max_starts():      # (more ran as many as there are, without a word)
            raise InputError(f"must be in 1..{max_starts()} (the neutral start and the corner starts), got "
                             f"{args.refit_starts}", field="--refit-starts")
    if args.plot:
        from instances.paths import check_output_dir
        check_output_dir(args.plot, "--plot")                   # before a minute of work
    if args.against == "local":
        return _accuracy_local(args)
    import time

    from estimators.evaluation.accuracy import against_arena, dp_memory_check
    t0 = time.perf_counter()

    def progress(line: str, end: str = " ...") -> None:   # stderr: --json stays pure JSON on stdout
        print(f"estimate accuracy [{time.perf_counter() - t0:5.1f} s]: {line}{end}", file=sys.stderr, flush=True)

    progress("against Arena's measured table (about a minute on a quiet machine)")
    out = against_arena(seed=args.seed, few_shot=args.few_shot, progress=progress)
    progress("pure data parallelism vs Arena's DP memory table")
    out["dp_memory"] = dp_memory_check()
    if args.refit_analytic:
        from estimators.evaluation.accuracy import analytic_refit
        progress("refitting the analytic constants (minutes per fold)")
        out["analytic_refit"] = analytic_refit(max_evals=args.refit_evals, regimes=tuple(args.refit_regimes),
                                               seed=args.seed, starts=args.refit_starts)
    progress("done", "")
    plots = []
    if args.plot:
        from ..accuracy_plots import write_accuracy_plots
        plots = write_accuracy_plots(out, args.plot)
    if args.json:
        print(dumps(out, indent=1))
        return 0
    for p in plots:
        print(f"wrote {p}")
    print(f"Arena measured table: {out['measured_rows']} measured rows, {out['predicted_rows']} predicted "
          f"(the others the memory model calls infeasible: {len(out['called_infeasible_but_measured'])})")
    print("MAPE. analytic: catalog specs + six global efficiency factors fitted on all rows (in-sample).\n"
          "learned: analytic x learned correction, tested on rows it never trained on: new GPU type\n"
          "(leave-one-type-out), new models, new rows (5 folds); correction chosen inside each fold")
    for title, key in (("GPUs", "by_gpus"), ("GPU type", "by_gpu_type"), ("family", "by_family")):
        print(f"  {title:<12} {'rows':>5} {'analytic':>9} {'new type':>9} {'new model':>9} {'new row':>9}")
        for k, v in out[key].items():
            lm = v["learned_mape"]
            print(f"  {k:<12} {v['rows']:>5} {_fmt(v['analytic_mape']):>9} {_fmt(lm['gpu_type']):>9} "
                  f"{_fmt(lm['model']):>9} {_fmt(lm['row']):>9}")
    o = out["overall"]
    lm = o["learned_mape"]
    print(f"  {'overall':<12} {out['predicted_rows']:>5} {_fmt(o['analytic_mape']):>9} {_fmt(lm['gpu_type']):>9} "
          f"{_fmt(lm['model']):>9} {_fmt(lm['row']):>9}")
    ll = o["learned_level_mape"]
    print(f"  {'learned-level':<12} {out['predicted_rows']:>5} {'':>9} {_fmt(ll['gpu_type']):>9} "
          f"{_fmt(ll['model']):>9} {_fmt(ll['row']):>9}  (one factor per family and GPU type: ranks like analytic "
          f"within a type)")
    for by, folds in out["learned_folds"].items():
        chosen = ", ".join(f"{f['test_groups'][0] if by == 'gpu_type' else k + 1}: {f['chosen']}"
                           for k, f in enumerate(folds))
        print(f"  learned correction chosen per fold ({by}): {chosen}")
    print("error left after the best scale factor per group (an in-sample oracle: a bound on what such a\n"
          "recalibration could reach; per model x type x shape only the batch varies, i.e. the table's noise)")
    for kind, groups in out["scale_oracle"].items():
        print(f"  {kind:<24} " + ", ".join(f"{g} ({v['groups']}) {_fmt(v['mape']).strip()}"
                                          for g, v in groups.items()))
    _print_grid_choice(out["grid_choice"])
    if "few_shot" in out:
        f = out["few_shot"]
        print(f"new GPU type with k of its rows as telemetry (learned, {f['correction']} trees forced on; "
              f"{f['test_rows']} test rows over {len(f['seeds'])} seeds, the same for every k; analytic on them "
              f"{_fmt(f['analytic_mape']).strip()}):")
        print("  " + ", ".join(f"k={k}: {_fmt(v).strip()}" for k, v in f["learned_mape"].items()))
        for t, d in f["by_gpu_type"].items():
            print(f"    {t:<12} " + ", ".join(f"k={k}: {_fmt(v).strip()}" for k, v in d.items()))
    if "analytic_refit" in out:
        a = out["analytic_refit"]
        print(f"analytic constants refitted ({a['starts']} start(s) x {a['max_evals']} evaluations per fit, "
              f"{a['seconds']:.0f} s): "
              f"in-sample {_fmt(a['in_sample_mape'])}")
        for by, r in a["regimes"].items():
            print(f"  out of sample ({by}): analytic {_fmt(r['mape'])}, with the learned correction trained on "
                  f"the same fold's rows {_fmt(r['learned_mape'])} over {r['rows']} rows")
            for f in r["folds"]:
                print(f"    held out {f['held_out']:<12} {f['test_rows']:>4} rows  {_fmt(f['mape'])}  "
                      f"bias {100 * f['bias']:+.1f}%  learned {_fmt(f['learned_mape'])} ({f['learned_correction']})")
            for name, by_group in r["grid_choice"].items():
                parts = []
                for g, t in (("same GPU type", "total"), ("same GPU type", "per_gpu"), ("any GPU type", "per_gpu")):
                    q = by_group[g][t]
                    parts.append(f"{g} {t}: mean {_fmt(q['mean']).strip()}, >=90% {_fmt(q['fraction_ge_90']).strip()}, "
                                 f"clean {_fmt(q['clean']['mean']).strip()}")
                print(f"    grid choice, {name}: " + "; ".join(parts))
    m = out["oom"]
    print(f"out-of-memory rows: {out['oom_rows']}; also called infeasible: {out['oom_rows_called_infeasible']}; "
          f"contradicted by the table itself (same model and shape ran with a larger batch): "
          f"{m['contradicted_by_table']}")
    if m["ranking_auc"] is not None:
        print(f"  memory ranking: the {m['uncontradicted']} other OOM rows need more of their GPU's memory "
              f"(lowest-memory plan) than a measured row with probability {m['ranking_auc']:.3f} (AUC); "
              f"measured rows peak at <= {100 * m['measured_max_lowest_fraction']:.0f}% of GPU memory")
    g = m["grid_margin_cv"]
    lomo, full = g["leave_one_model_out"], g["all_rows"]
    folds = "; ".join(f"seed {k}: {v['fitting_rows_called_infeasible']} and {v['oom_rows_called_infeasible']}"
                      for k, v in g["five_model_folds"].items())
    print(f"  grid memory margin (a grid fits when its lowest-memory plan x margin fits), chosen on held-out models: "
          f"rows that ran called infeasible / OOM rows called infeasible: leave-one-model-out "
          f"{lomo['fitting_rows_called_infeasible']}/{g['measured_rows']} and "
          f"{lomo['oom_rows_called_infeasible']}/{g['oom_rows']}; 5 model folds ({folds}); chosen on all rows "
          f"{full['margin']:.3f} (limit {100 * full['limit_fraction']:.1f}% of GPU memory), in use "
          f"{g['margin_in_use']}")
    d = out["dp_memory"]
    print(f"pure data parallelism vs Arena's DP memory table (on {d['gpu_type']}): fitting rows called feasible "
          f"{d['fit_rows_called_feasible']}/{d['fit_rows']}; OOM rows called infeasible "
          f"{d['oom_rows_called_infeasible']}/{d['oom_rows']}")
    return 0


def _print_grid_choice(gc: dict) -> None:
    print("grid choice: true throughput of the shape each estimate ranks best, over the true best, per group of\n"
          "measured rows (model, batch and: one GPU type / one GPU count / any type); mean, share of groups >= 90%,\n"
          "worst group, mean Spearman (groups >= 3 rows); misses < 90% (how many the table contradicts itself on);\n"
          "clean: groups without a superlinear, more-nodes-faster or batch-superlinear row in the table")
    for name, by_group in gc.items():
        print(f"  {name}")
        for g, by_t in by_group.items():
            for t, q in by_t.items():
                c = q["clean"]
                rho = "-" if q["spearman_mean"] is None else f"{q['spearman_mean']:.2f}"
                print(f"    {g:<14} {t:<7} {q['groups']:>3} groups: mean {_fmt(q['mean']).strip():>6}, >=90% "
                      f"{_fmt(q['fraction_ge_90']).strip():>6}, worst {_fmt(q['worst']['fraction']).strip()} "
                      f"({q['worst']['group']}), rho {rho}, misses {len(q['misses'])} "
                      f"({q['misses_table_suspect']} table); clean {c['groups']}: mean {_fmt(c['mean']).strip()}, "
                      f"worst {_fmt(c['worst']['fraction'] if c['worst'] else None).strip()}")


def local_json(passes, summary: dict) -> dict:
    """``--against local --json``: the summary (``summarize_passes``, with the load) and every
    pass's results under ``passes``."""
    return {**summary, "passes": [[dict(vars(r), rel_error=r.rel_error, rel_error_cache=r.rel_error_cache)
                                   for r in res] for res in passes]}


def _accuracy_local(args) -> int:
    from estimators.evaluation.local_accuracy import LOCAL_MODEL, against_local, summarize_passes
    from estimators.profile_store import ProfileStore
    from instances.errors import InputError
    from instances.limits import MAX_PROFILE_REPEATS
    if not 1 <= args.passes <= MAX_PROFILE_REPEATS:
        raise InputError(f"must be in 1..{MAX_PROFILE_REPEATS:,}, got {args.passes}", field="--passes")
    if args.store is not None:                  # (profiled into: checked before the first pass, not after)
        from instances.paths import check_output_dir
        check_output_dir(args.store, "--store")
    if args.model:
        from instances.models import get_model
        with fields_as_flags({"model": "--model"}):
            get_model(args.model)
    import os
    passes, loads = [], []
    for k in range(args.passes):
        print(f"pass {k + 1}/{args.passes}: profiling, then the runs ...", file=sys.stderr, flush=True)
        before = os.getloadavg()[0]
        passes.append(against_local(model=args.model or LOCAL_MODEL,
                                    store=None if args.store is None else ProfileStore(args.store)))
        loads.append((before, os.getloadavg()[0]))        # timings mean little on a loaded host
    summary = summarize_passes(passes)
    summary["load_average_1min"] = loads
    if args.json:
        print(dumps(local_json(passes, summary), indent=1))
        return 0
    print(f"local torch runs of {args.model or LOCAL_MODEL} (launcher, gloo on CPU) vs analytic estimate "
          f"from the profile store")
    for k, res in enumerate(passes):
        print(f"pass {k + 1} (1-minute load average {loads[k][0]:.1f} before, {loads[k][1]:.1f} after)")
        print(f"{'dp':>3} {'tp':>3} {'pp':>3} {'m':>3} {'measured s':>11} {'estimated s':>12} {'error':>7}")
        for r in res:
            meas = "failed" if r.measured_s is None else f"{r.measured_s:.4f}"
            print(f"{r.dp:>3} {r.tp:>3} {r.pp:>3} {r.microbatches:>3} {meas:>11} {r.estimated_s:>12.4f} "
                  f"{_fmt(r.rel_error)}  {r.error}")
    print("per plan, median error over the passes (with the cache model, not validated yet; step working set, "
          "cache hit):")
    for p in summary["plans"]:
        errs = " ".join(_fmt(e).strip() for e in p["errors"])
        ws = " ".join("-" if w is None else f"{w:.1f}" for w in p["working_set_mib"])
        hits = " ".join(f"{h:.2f}" for h in p["cache_hit"])
        print(f"  dp {p['dp']} tp {p['tp']} pp {p['pp']} m {p['microbatches']}: {_fmt(p['median_error'])}  ({errs}); "
              f"with {_fmt(p['median_error_cache']).strip()}; {ws} MiB, hit {hits}")
    if summary["mape"] is not None:
        per = ", ".join(_fmt(m).strip() for m in summary["pass_mape"])
        print(f"MAPE of the per-plan medians {100 * summary['mape']:.1f}% over {summary['pass_count']} passes "
              f"(each pass alone: {per}); with the cache model {_fmt(summary['mape_cache']).strip()}")
    return 0


def _proxy_quality(args) -> int:
    from estimators.evaluation.accuracy import proxy_quality
    from instances.errors import InputError
    check_batch(args.batch)
    from instances.limits import MAX_EXHAUSTIVE_SPLITS
    if not 1 <= args.max_splits <= MAX_EXHAUSTIVE_SPLITS:
        raise InputError(f"must be in 1..{MAX_EXHAUSTIVE_SPLITS:,}, got {args.max_splits}", field="--max-splits")
    if args.model:
        from instances.models import get_model
        with fields_as_flags({"model": "--model"}):
            get_model(args.model)                               # an unknown name says so, with the known ones
    models = [args.model] if args.model else None
    out = proxy_quality(models=models, batches=(args.batch,), max_exhaustive_splits=args.max_splits)
    if args.json:
        print(dumps(out, indent=1))
        return 0
    print(f"proxy plan vs exhaustive best over {out['grids']} grids ({out['plans_evaluated']} plans searched, "
          f"{out['seconds']:.1f} s)")
    print(f"  mean proxy / exhaustive-search throughput: {_fmt(out['mean_fraction_of_best'])} (above 100% where "
          f"the proxy finds a plan the bounded search misses: {out['grids_proxy_beats_search']} grids)")
    print(f"  mean proxy / best known plan (the better of the two): {_fmt(out['mean_fraction_of_best_known'])} "
          f"(what the proxy gives up)")
    print(f"  within 5% of the search's best: {_fmt(out['fraction_within_5pct'])} of grids; worst "
          f"{_fmt(out['min_fraction_of_best'])}")
    for w in out["worst"]:
        print(f"  worst: {w['model']} batch {w['batch']} {w['grid']}: {_fmt(w['fraction'])}")
    return 0
