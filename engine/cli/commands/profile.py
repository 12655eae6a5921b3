"""`arena profile`: measure layer and collective costs into the profile store and report
the profiling cost against running every grid directly."""
from __future__ import annotations

from instances.limits import MAX_PROFILE_REPEATS

from ..flags import fields_as_flags
from ..jsonout import dumps

# the flag behind each field the profiler's configs and the cost comparison refuse
PROFILE_FLAGS = {"model": "--model", "micro_batches": "--micro-batches", "tp_degrees": "--tp",
                 "repeats": "--repeats", "global_batch": "--batch", "warmup_iters": "--warmup-iters",
                 "measured_iters": "--measured-iters", "plan": "--batch"}


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="profile layers and collectives with torch into the profile store",
                              description=__doc__)
    p.add_argument("--model", action="append", required=True,
                   help="catalog model (repeatable), e.g. tiny-gpt__4L or gpt__1.3B (reduced shapes on CPU), or a "
                        "Hugging Face-style config.json")
    p.add_argument("--store", default=None, help="profile store directory (default $ARENA_PROFILE_DIR or "
                   "~/.cache/arena/profiles)")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2],
                   help="micro-batch sizes to profile each layer at (default 1 2)")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="tensor-parallel shard widths")
    p.add_argument("--repeats", type=int, default=3,
                   help=f"timed repetitions per measurement (default 3, at most {MAX_PROFILE_REPEATS:,})")
    p.add_argument("--no-collectives", action="store_true", help="skip the collective benchmarks")
    p.add_argument("--group-sizes", type=int, nargs="+", default=None,
                   help="process-group sizes of the collective benchmarks, each at most the GPUs torch sees (CUDA) or "
                        "the CPU cores this process may use (default 2, where the host runs 2; else no collectives, "
                        "said)")
    p.add_argument("--no-reuse", action="store_true", help="re-measure layers the store already holds")
    p.add_argument("--batch", type=int, default=8, help="global batch for the cost comparison")
    p.add_argument("--max-gpus", type=int, default=16, help="largest grid in the cost comparison")
    p.add_argument("--warmup-iters", type=int, default=3,
                   help=f"untimed iterations before measuring (default 3, at most {MAX_PROFILE_REPEATS:,})")
    p.add_argument("--measured-iters", type=int, default=10,
                   help=f"timed iterations per repetition (default 10, at most {MAX_PROFILE_REPEATS:,})")
    p.add_argument("--run-grids", type=int, default=0, metavar="N",
                   help="also run, for real, every grid of at most N devices with its proxy plan (launcher, one "
                        "process per device; N at most the GPUs torch sees, or the CPU cores this process may use) "
                        "and compare measured device-seconds (0: off)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def check_args(args) -> None:
    """Every option, refused by its flag before any profiling (a launch is timed first)."""
    from estimators.profiler import check_group_sizes, check_micro_batches, local_ranks
    from instances.cluster import MAX_CLUSTER_GPUS
    from instances.errors import InputError
    from instances.limits import show_number
    from instances.models import get_model

    from ..common import check_batch
    check_batch(args.batch)
    ranks, what = local_ranks()
    for flag, v, lo, hi in (("--max-gpus", args.max_gpus, 1, MAX_CLUSTER_GPUS),
                            ("--run-grids", args.run_grids, 0, ranks),
                            ("--warmup-iters", args.warmup_iters, 0, MAX_PROFILE_REPEATS),
                            ("--measured-iters", args.measured_iters, 1, MAX_PROFILE_REPEATS),
                            ("--repeats", args.repeats, 1, MAX_PROFILE_REPEATS)):
        if not lo <= v <= hi:
            raise InputError(f"must be in {lo}..{hi:,}{f' (the {what})' if flag == '--run-grids' else ''}, "
                             f"got {show_number(v)}", field=flag)
    if args.group_sizes is not None:
        if args.no_collectives:
            raise InputError("given with --no-collectives, which skips the collectives", field="--group-sizes")
        check_group_sizes(args.group_sizes, "--group-sizes")
    with fields_as_flags(PROFILE_FLAGS):
        archs = [get_model(name) for name in args.model]       # an unknown model fails now, not later
    for arch in archs:
        check_micro_batches(arch, args.micro_batches, field="--micro-batches")
    for tp in args.tp:                                          # (a degree no model takes would measure nothing)
        if tp >= 1 and archs and all(a.is_transformer and (a.num_heads % tp or a.kv_heads % tp) for a in archs):
            heads = ", ".join(f"{a.name}: {a.num_heads} heads, {a.kv_heads} KV heads" for a in archs)
            raise InputError(f"tensor degree {tp} divides the attention heads of no model given ({heads}): nothing "
                             "would be measured at it", field="--tp")


def default_group_sizes() -> list[int]:
    """``--group-sizes`` not given: a group of 2, where this host runs 2 processes at once;
    else none, said on stderr."""
    import sys

    from estimators.profiler import local_ranks
    ranks, what = local_ranks()
    if ranks >= 2:
        return [2]
    print(f"arena profile: collectives not profiled: this host has {ranks} {what}, and a collective needs 2 "
          "(--no-collectives says so without this note)", file=sys.stderr)
    return []


def run(args) -> int:
    with fields_as_flags(PROFILE_FLAGS):
        return _run(args)


def _run(args) -> int:
    from estimators.analytic import AnalyticModel
    from estimators.profile_store import ProfileStore
    from estimators.profiler import (
        ProfilerConfig,
        RunCostConfig,
        measure_startup_s,
        profile_collectives,
        profile_layers,
        run_every_grid_cost,
        run_grids_measured,
        startup_model,
    )
    from instances.cluster import ClusterSpec, NodeGroup
    from instances.gpus import get_gpu
    from instances.models import get_model
    from instances.paths import check_output_dir
    store = ProfileStore(args.store)
    check_output_dir(store.root, "--store")                     # before any profiling
    check_args(args)
    cfg = ProfilerConfig(micro_batches=tuple(args.micro_batches), tp_degrees=tuple(args.tp), repeats=args.repeats)
    out = {"store": str(store.root), "models": {}}
    coll_s = 0.0
    group_sizes = args.group_sizes if args.group_sizes is not None else default_group_sizes()
    if not args.no_collectives and group_sizes:
        c = profile_collectives(group_sizes=tuple(group_sizes), store=store)
        coll_s = c["device_seconds"]
        out["collectives"] = {"device": c["device"], "backend": c["backend"], "records": len(c["records"]),
                              "unsupported": c["unsupported"], "device_seconds": coll_s}
    for name in args.model:
        arch = get_model(name)
        timed = startup_model(arch.name)
        startup = measure_startup_s(timed, args.batch)
        run_cfg = RunCostConfig(args.warmup_iters, args.measured_iters, startup)
        r = profile_layers(arch, store=store, cfg=cfg, reuse=not args.no_reuse)
        device = r["device"]
        perf = AnalyticModel(profile_store=store, profile_device=device)
        gpu = get_gpu(device) if device else None
        cluster = ClusterSpec((NodeGroup(gpu.name, max(1, args.max_gpus // gpu.default_gpus_per_node),
                                         gpu.default_gpus_per_node),))
        grid_cost = run_every_grid_cost(arch.name, args.batch, perf, cluster, max_gpus=args.max_gpus, cfg=run_cfg)
        prof_s = r["device_seconds"] + coll_s
        measured = None
        if args.run_grids:
            measured = run_grids_measured(arch.name, args.batch, perf, cluster, max_ranks=args.run_grids,
                                          cfg=run_cfg)
        out["models"][arch.name] = {
            "device": device, "startup_s": startup, "startup_timed_with": timed, "layer_records": len(r["records"]),
            "reused_records": r["reused"],
            "layer_device_seconds": r["device_seconds"], "profile_device_seconds": prof_s,
            "run_every_grid": grid_cost,
            "cost_ratio": (grid_cost["device_seconds"] / prof_s) if prof_s > 0 else None,
            "run_grids_measured": measured,
            "measured_cost_ratio": (measured["device_seconds"] / prof_s) if measured and prof_s > 0 else None,
            "scaled": sorted({f"{x.kind}: x{x.scale:.3g}" for x in r["records"] if x.scale != 1.0})}
    if args.json:
        print(dumps(out, indent=1))
        return 0
    print(f"profile store: {out['store']}")
    if "collectives" in out:
        c = out["collectives"]
        print(f"collectives on {c['device']} ({c['backend']}): {c['records']} measurements, "
              f"{c['device_seconds']:.1f} device-s; unsupported by the backend: {', '.join(c['unsupported']) or '-'}")
    for name, m in out["models"].items():
        g = m["run_every_grid"]
        ratio = f"{m['cost_ratio']:.1f}x" if m["cost_ratio"] else "n/a"
        print(f"{name}: one launch costs {m['startup_s']:.2f} s beyond its steps (measured: one rank, one step"
              f"{'' if m['startup_timed_with'] == name else ' of ' + m['startup_timed_with'] + ' as a stand-in'})")
        print(f"{name} on {m['device']}: {m['layer_records']} layer measurements ({m['reused_records']} reused), "
              f"{m['profile_device_seconds']:.1f} device-s incl. collectives; running each of {g['grids']} grids "
              f"({args.warmup_iters}+{args.measured_iters} iterations + start-up) ~ {g['device_seconds']:.1f} "
              f"device-s (estimated) -> profiling is {ratio} cheaper")
        mg = m["run_grids_measured"]
        if mg is not None:
            print(f"  measured: running the {mg['grids']} grids of at most {args.run_grids} devices took "
                  f"{mg['device_seconds']:.1f} device-s (estimate for them: "
                  f"{mg['estimated_device_seconds_same_grids']:.1f}) -> running just these costs "
                  f"{m['measured_cost_ratio']:.1f}x the device-seconds of profiling every grid")
            for run in mg["runs"]:
                status = f"{run['device_seconds']:.1f} device-s" if run["ok"] else f"failed: {run['error']}"
                print(f"    {run['grid']:<14} {run['plan']:<18} {status}")
        if m["scaled"]:
            print(f"  measured at reduced shape and scaled by FLOP ratio: {'; '.join(m['scaled'][:4])}")
    return 0
