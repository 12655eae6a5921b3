"""`arena simulate`: replay a workload on a cluster under one policy.

Examples::

    arena simulate                                    # the demo instance under fcfs
    arena simulate --instance arena-philly --policy fcfs --run-out
    arena simulate --instance demo --policy arena --perf analytic --policy-opt time_limit_s=5
    arena simulate --cluster sim_cluster_spec.json --trace simulate_trace_philly.csv \\
        --trace-opt iteration_divisor=5 --rounds 2000
    arena simulate --instance demo --policy arena --shadow-policy sia-ap   # where would sia-ap differ?

Writes summary.json, jobs.csv, rounds.csv, moves.csv (and shadow.csv with a shadow
policy) and PNG plots to ``--out`` (default ``results/<instance>-<policy>/``), prints a
summary table, and shows a progress line on stderr while it runs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from instances.errors import InputError
from instances.limits import check_time

from .flags import fields_as_flags


def parse_value(text: str):
    """CLI option value: int, float, bool (true/false), none, else the string itself."""
    low = text.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def seed_arg(text: str) -> int:
    """``--seed``: an integer >= 0 (numpy's generators refuse negative seeds)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {v}")
    return v


def parse_options(items: list[str] | None, flag: str) -> dict:
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"expected KEY=VALUE, got {item!r}", field=flag)
        if key.strip() in out:                  # the last would win without a word
            raise InputError(f"{key.strip()} given twice ({out[key.strip()]!r} and {parse_value(value)!r}); "
                             "give it once", field=flag)
        out[key.strip()] = parse_value(value)
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="simulate a policy on an instance or a cluster + trace",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    add_workload_args(p.add_argument_group("workload (default: --instance demo)"))
    from ..policy import policy_names
    p.add_argument("--policy", default="fcfs", metavar="NAME",
                   help=f"scheduling policy: {', '.join(policy_names())} (default fcfs)")
    p.add_argument("--policy-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option (repeatable); values parsed as int/float/bool/str")
    p.add_argument("--perf", default=None, metavar="KIND",
                   help="performance model the policy decides with: analytic, learned, learned-choice, "
                        "learned-level, table, online. fcfs needs none; the others default to analytic (it ranks "
                        "grids best); online (analytic corrected by the running jobs' measured iterations): arena "
                        "and sia-ap decided better with it on philly, venus, pai and overloaded "
                        "(docs/engine.md), but replay slower; table (the oracle's own measurements) is the labelled "
                        "mode that reproduces the published comparison")
    add_shadow_args(p)
    add_profile_store_arg(p)
    add_perf_runtime_arg(p)
    p.add_argument("--reconfig-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="move cost model: preset=arena (default), realistic or local, and field overrides, e.g. "
                        "startup_s=30 (repeatable)")
    p.add_argument("--rounds", type=int, default=None, help="horizon in rounds (default: the instance's)")
    p.add_argument("--run-out", action="store_true",
                   help="after the horizon, keep going until every job finishes (adds *_runout metrics)")
    p.add_argument("--max-rounds", type=int, default=None, metavar="N",
                   help="run-out safety limit in rounds (default 1,000,000: about 9.5 simulated years at "
                        "300 s and 0.5 GB of round records); a run stopped by it says so")
    p.add_argument("--round-interval", type=float, default=None, metavar="S",
                   help="seconds between rounds (default: the instance's, 300)")
    p.add_argument("--seed", type=seed_arg, default=0, help="instance and policy seed (default 0)")
    add_outages_arg(p)
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default results/<instance>-<policy>)")
    p.add_argument("--dump-rounds", default=None, metavar="DIR",
                   help="ask the policy to dump each round's model to DIR (policies that support it)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def add_shadow_args(p) -> None:
    p.add_argument("--shadow-policy", default=None, metavar="NAME",
                   help="a second policy asked every round on the same state and compared with the one that "
                        "decides; never carried out (engine/shadow.py)")
    p.add_argument("--shadow-policy-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="the shadow policy's options (repeatable)")


def build_policy(name: str, opts: dict, *, name_flag: str = "--policy", opt_flag: str = "--policy-opt"):
    """The policy ``name`` built from ``opts``; an unknown name is an ``InputError`` on
    ``name_flag``, a refused option one on ``opt_flag`` (the policy's own message names the
    policy and the key, said once)."""
    from ..policy import make_policy, policy_names
    if name not in policy_names():
        raise InputError(f"unknown policy {name!r}; known: {', '.join(policy_names())}", field=name_flag)
    try:
        policy = make_policy(name, **opts)
    except (TypeError, ValueError) as e:
        reason = e.reason if isinstance(e, InputError) else str(e)
        if not opts and not isinstance(e, InputError):     # no option given: the policy's own failure
            raise InputError(f"policy {name!r}{_defined_in(name)} could not be built: {type(e).__name__}: "
                             f"{reason}{_raised_at(e)}", field=name_flag) from None
        if not reason.startswith(f"policy {name!r}"):
            reason = f"policy {name!r}: {reason}"
        if isinstance(e, InputError) and e.field and e.field not in reason:
            reason += f" (option {e.field})"
        raise InputError(reason, field=opt_flag) from None
    if not callable(getattr(policy, "decide", None)):
        raise InputError(f"policy {name!r}{_defined_in(name)} built a {type(policy).__name__} object, which has "
                         "no decide(ctx) method", field=name_flag)
    return policy


def _defined_in(name: str) -> str:
    """' (defined in FILE)' of a registered policy's factory, when it is not one of ours
    (a plug-in's policy names its file)."""
    import inspect

    from ..policy import POLICIES
    try:
        file = inspect.getsourcefile(POLICIES.get(name))
    except (TypeError, InputError):
        return ""
    return "" if file is None or "/engine/policies/" in file.replace("\\", "/") else f" (defined in {file})"


def _raised_at(e: BaseException) -> str:
    """' (FILE, line N)' of the frame that raised ``e``."""
    import traceback
    frames = traceback.extract_tb(e.__traceback__)
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def build_shadow(args):
    """The shadow policy of ``--shadow-policy`` (None without it), validated like ``--policy``."""
    if args.shadow_policy is None:
        if args.shadow_policy_opt:
            raise InputError("given without --shadow-policy", field="--shadow-policy-opt")
        return None
    return build_policy(args.shadow_policy, parse_options(args.shadow_policy_opt, "--shadow-policy-opt"),
                        name_flag="--shadow-policy", opt_flag="--shadow-policy-opt")


def model_reader(args) -> str:
    """The policy whose needs decide whether a performance model is built: the one that
    decides, or the shadow when the one that decides needs none (fcfs beside a shadow)."""
    if args.shadow_policy is not None and decides_without_model(args.perf, args.policy):
        return args.shadow_policy
    return args.policy


def add_workload_args(p) -> None:
    """``--instance`` or ``--cluster`` with ``--trace`` (and ``--trace-opt``): what
    ``build_instance`` reads (simulate, bench policies, bench bound)."""
    p.add_argument("--instance", default=None, help="built-in instance (see `arena instances`; default demo)")
    p.add_argument("--cluster", default=None, help="cluster JSON (ours or Arena's sim_cluster_spec.json), with --trace")
    p.add_argument("--trace", default=None,
                   help="job trace (ours, Arena's or Philly's CSV; auto-detected), with --cluster")
    p.add_argument("--trace-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="trace import option, e.g. iteration_divisor=5 (repeatable)")
    p.add_argument("--sia-artifact", default=None, metavar="DIR",
                   help="the Sia (SOSP'23) artifact's folder, for --instance sia:TRACE/WORKLOAD (e.g. "
                        "sia:philly/workload-1): its cluster, workloads and profiles (docs/sia-artifact.md)")


def add_outages_arg(p) -> None:
    """``--outages FILE`` (simulate, bench policies)."""
    p.add_argument("--outages", default=None, metavar="FILE",
                   help="node outages: a CSV node,start_s,end_s[,reason] (node id or host; times on the trace's "
                        "clock; empty end_s: never back); jobs on a node that goes out are evicted with their "
                        "progress and placed again elsewhere")


def load_outages_arg(path: str | None, cluster) -> tuple:
    """The outages ``--outages`` names, checked against ``cluster`` (none: ())."""
    if not path:
        return ()
    from instances.outages import load_outages
    return load_outages(path, cluster)


def build_instance(args):
    """The instance named by --instance, or built from --cluster and --trace."""
    from instances.sia_instances import is_sia_name
    artifact = getattr(args, "sia_artifact", None)
    if is_sia_name(args.instance):
        if args.cluster or args.trace or args.trace_opt:
            raise InputError("a sia: instance brings its own cluster and jobs: drop --cluster, --trace and "
                             "--trace-opt", field="--instance")
        from instances.sia_instances import load_sia_instance
        return load_sia_instance(args.instance, artifact)
    if artifact is not None:
        raise InputError("--sia-artifact is read only for --instance sia:TRACE/WORKLOAD", field="--sia-artifact")
    if args.cluster or args.trace:
        if args.instance:
            raise InputError("give either --instance or --cluster with --trace, not both", field="--instance")
        if not (args.cluster and args.trace):
            raise InputError("--cluster and --trace go together", field="--trace" if args.cluster else "--cluster")
        from instances.builtin import Instance
        from instances.cluster import load_cluster
        from instances.oracle import TableOracle
        from instances.traces import load_trace
        cluster = load_cluster(args.cluster)
        jobs = load_trace(args.trace, cluster=cluster, **parse_options(args.trace_opt, "--trace-opt"))
        if not jobs:
            raise InputError("trace holds no jobs", file=args.trace)
        name = Path(args.trace).name.split(".")[0]
        return Instance(name, f"{args.trace} on {args.cluster}", cluster, tuple(jobs), TableOracle(seed=args.seed))
    if args.trace_opt:
        raise InputError("--trace-opt applies to --trace only", field="--trace-opt")
    from instances.builtin import get_instance
    try:
        return get_instance(args.instance or "demo", args.seed)
    except InputError as e:
        if e.field == "name":
            raise InputError(e.reason, field="--instance") from None
        raise


def decides_without_model(kind: str | None, policy_name: str) -> bool:
    """fcfs with no ``--perf`` decides without a performance model."""
    return kind is None and policy_name == "fcfs"


def build_perf(kind: str | None, policy_name: str, profile_store: str | None = None, runtime: str | None = None,
               truth_runtime: str = "default", oracle=None):
    """The performance model a policy decides with: ``kind``, else the default
    (``estimators.perf.default_kind``: analytic; never the table the oracle uses as
    truth), reading ``profile_store`` (``--profile-store``) when given, for the training
    ``runtime`` (``--perf-runtime``: ``estimators.perf.make_default_model``); when not
    given, ``truth_runtime``: the runtime the instance's truth was measured under (the
    oracle's ``training_runtime``). fcfs needs none (and refuses either option). On the
    Sia artifact's instances (``oracle`` a ``GoodputOracle``) every policy decides with
    the goodput model of its profiles (``estimators.goodput.GoodputModel``)."""
    from instances.goodput import GoodputOracle
    if isinstance(oracle, GoodputOracle):
        return goodput_perf(kind, profile_store, runtime, oracle)
    if decides_without_model(kind, policy_name):
        for value, flag in ((profile_store, "--profile-store"), (runtime, "--perf-runtime")):
            if value is not None:
                raise InputError(f"fcfs decides without a performance model: {flag} would not be read "
                                 f"(give --perf too, or drop {flag})", field=flag)
        return None
    try:
        from estimators.perf import make_default_model
    except ImportError:
        if kind is None and profile_store is None:
            return None
        raise InputError("no performance models are available in this build", field="--perf") from None
    runtime = runtime or truth_runtime
    from estimators.perf import passed_over_artifact
    unused = passed_over_artifact(kind, runtime)
    if unused is not None:                           # say so rather than pass over the user's artifact silently
        print(f"note: the learned artifact {unused} was fitted for another runtime; fitting the learned model "
              f"afresh for the {runtime} runtime (--perf-runtime default uses the artifact)",
              file=sys.stderr, flush=True)
    if profile_store is not None and Path(profile_store).exists() and not Path(profile_store).is_dir():
        raise InputError("is a file; a profile store is a folder (`arena profile --store DIR` fills one)",
                         file=profile_store, field="--profile-store")
    with fields_as_flags({"kind": "--perf", "profile_store": "--profile-store", "runtime": "--perf-runtime"}):
        return make_default_model(kind, profile_store=profile_store, runtime=runtime)


def goodput_perf(kind: str | None, profile_store: str | None, runtime: str | None, oracle):
    """The goodput model of a ``sia:`` instance; ``--perf``, ``--profile-store`` and
    ``--perf-runtime`` do not apply there."""
    from estimators.goodput import GoodputModel
    if kind is not None and kind != GoodputModel.name:
        raise InputError(f"the Sia artifact's goodput jobs are estimated from its own profiles ({GoodputModel.name}); "
                         f"--perf {kind} does not apply to them", field="--perf")
    for value, flag in ((profile_store, "--profile-store"), (runtime, "--perf-runtime")):
        if value is not None:
            raise InputError(f"the Sia artifact's goodput jobs are estimated from its own profiles; {flag} does not "
                             "apply to them", field=flag)
    return GoodputModel(oracle.world)


def reconfig_for(inst, reconfig_opts: dict):
    """The move cost model ``--reconfig-opt`` names; on the Sia artifact's instances the
    default preset is ``sia`` (each job's own restart time, as the artifact charges)."""
    from instances.goodput import GoodputOracle

    from ..reconfig import ReconfigCostModel
    opts = dict(reconfig_opts)
    goodput = isinstance(inst.oracle, GoodputOracle)
    if goodput and "preset" not in opts:
        opts["preset"] = "sia"
    try:
        model = ReconfigCostModel.from_options(opts)
    except (TypeError, ValueError) as e:
        raise InputError(str(e), field="--reconfig-opt") from None
    if goodput and model.moves is not None:
        raise InputError(f"preset {model.preset} prices a move by the model's size; the Sia artifact's jobs have no "
                         "model architecture: use preset=sia (their own restart times, the default) or preset=arena",
                         field="--reconfig-opt")
    return model


def add_perf_runtime_arg(p) -> None:
    """``--perf-runtime`` (simulate, bench policies): the training runtime the estimates assume."""
    p.add_argument("--perf-runtime", default=None, choices=("default", "arena"),
                   help="the training runtime the performance model assumes (default: the one the instance's "
                        "truth was measured under, arena for every table oracle): default (the estimator "
                        "defaults, this project's launcher: Adam, no recomputation) or arena (the Arena "
                        "artifact's, under which its measured table was taken and the efficiency constants were "
                        "fitted: rematerialisation, a sharded optimizer)")


def add_profile_store_arg(p) -> None:
    """``--profile-store DIR`` (simulate, serve, bench policies): decide from the layer and collective times
    ``arena profile`` measured there instead of the catalog roofline."""
    p.add_argument("--profile-store", default=None, metavar="DIR",
                   help="profile store that `arena profile` filled: the performance model takes the profiled "
                        "device's layer and collective times from it (default: catalog specs)")


class ProgressLine:
    """One self-overwriting status line on stderr (plain text, at most ~4 updates/s)."""

    def __init__(self, stream=sys.stderr, min_interval_s: float = 0.25):
        self.stream, self.min_interval_s, self.last = stream, min_interval_s, 0.0
        self.tty = getattr(stream, "isatty", lambda: False)()

    def __call__(self, p) -> None:
        now = time.perf_counter()
        if now - self.last < (self.min_interval_s if self.tty else 5.0):
            return
        self.last = now
        if p.horizon_rounds >= p.max_rounds:
            where = f"round {p.round_index} (no horizon: until every job is done)"
        elif p.round_index <= p.horizon_rounds or not p.run_out:
            frac = min(1.0, p.round_index / max(1, p.horizon_rounds))
            bar = "#" * int(frac * 20)
            where = f"[{bar:<20}] round {p.round_index}/{p.horizon_rounds}"
        else:
            where = f"run-out: round {p.round_index} (horizon {p.horizon_rounds})"
        line = f"{where}  finished {p.jobs_finished}/{p.jobs_total}  {p.elapsed_s:.1f} s"
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()


class Interrupt:
    """Ctrl-C (SIGINT) during a run, as a ``stop`` the simulator asks before every round:
    the first asks the run to stop there (its results so far are written, and the command
    exits with status 130); a second stops at once (``KeyboardInterrupt``). Outside the
    main thread nothing is installed (the run then stops only at a second, plain Ctrl-C)."""

    EXIT_STATUS = 130                   # 128 + SIGINT, as a shell reports it

    def __init__(self, prog: str):
        self.prog, self.requested, self._old = prog, False, None

    def __enter__(self) -> "Interrupt":
        import signal
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:              # not the main thread
            self._old = None
        return self

    def __exit__(self, *exc) -> None:
        import signal
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{self.prog}: interrupted: stopping before the next round and writing the results so far "
              f"(Ctrl-C again to stop at once, writing nothing)", file=sys.stderr, flush=True)

    def __call__(self) -> bool:
        return self.requested


# simulate()'s parameters as the flags that set them
SIM_FLAGS = {"rounds": "--rounds", "max_rounds": "--max-rounds", "round_interval_s": "--round-interval"}


def report_incomplete(res, prog: str) -> None:
    """On stderr: every job never placed, with why, and a run-out that a safety stop ended."""
    from ..metrics import never_placed_lines
    for line in never_placed_lines(res):
        print(f"{prog}: {line}", file=sys.stderr)
    s = res.summary
    if s.get("stopped_by_safety"):
        if s.get("end_reason") == "safety limit":
            why = (f"reached the safety limit of {s['safety_limit_rounds']:,} rounds "
                   f"({s['safety_limit_rounds'] * s['round_interval_s'] / 86400 / 365:.1f} simulated years; "
                   f"raise it with --max-rounds)")
        elif s.get("end_reason") == "clock bound":
            why = (f"reached the bound on simulated time after {s['rounds_simulated']:,} rounds (the clock must stay "
                   f"<= 9e12 s, about 285,000 years; beyond it float time loses millisecond precision)")
        else:
            why = "stalled: nothing ran, nothing was left to arrive and the policy started nothing"
        print(f"{prog}: warning: the run-out ended before every job finished: {why}; "
              f"{s.get('jobs_unfinished_runout')} job(s) unfinished", file=sys.stderr)


def run(args) -> int:
    from ..metrics import format_summary
    from ..reconfig import ReconfigCostModel
    from ..simulator import SimConfig, simulate

    if args.rounds is not None and args.rounds < 1:
        raise InputError(f"must be >= 1, got {args.rounds}", field="--rounds")
    if args.round_interval is not None:
        check_time(args.round_interval, field="--round-interval", strict_min=True)
    if args.max_rounds is not None and args.max_rounds < 1:
        raise InputError(f"must be >= 1, got {args.max_rounds}", field="--max-rounds")
    limit = args.max_rounds if args.max_rounds is not None else SimConfig.max_rounds
    if args.rounds and args.rounds > limit:
        raise InputError(f"the horizon of {args.rounds:,} rounds exceeds the safety limit of {limit:,} rounds"
                         + ("" if args.max_rounds is not None else " (raise it with --max-rounds)"), field="--rounds")
    from instances.paths import check_output_dir
    if args.out is not None and not args.out.strip():
        raise InputError("is empty (leave it out for the default results/<instance>-<policy>)", field="--out")
    if args.out:
        check_output_dir(args.out, "--out")
    if args.dump_rounds:
        check_output_dir(args.dump_rounds, "--dump-rounds")
    opts = parse_options(args.policy_opt, "--policy-opt")
    if args.dump_rounds:
        opts["dump_rounds_dir"] = args.dump_rounds
    try:
        policy = build_policy(args.policy, opts)
    except InputError as e:
        if args.dump_rounds and "dump_rounds_dir" in e.reason:
            raise InputError(e.reason, field="--dump-rounds") from None
        raise
    shadow = build_shadow(args)
    reconfig_opts = parse_options(args.reconfig_opt, "--reconfig-opt")
    try:
        ReconfigCostModel.from_options(reconfig_opts)       # checked before any work
    except (TypeError, ValueError) as e:
        raise InputError(str(e), field="--reconfig-opt") from None
    inst = build_instance(args)
    reconfig = reconfig_for(inst, reconfig_opts)
    outages = load_outages_arg(args.outages, inst.cluster)
    perf = build_perf(args.perf, model_reader(args), args.profile_store, args.perf_runtime,
                      inst.oracle.training_runtime, inst.oracle)
    out = Path(args.out) if args.out else Path("results") / f"{inst.name}-{args.policy}"
    check_output_dir(out, "--out")
    bar = None if args.quiet else ProgressLine()
    t0 = time.perf_counter()
    try:
        with Interrupt("arena simulate") as interrupt:
            res = simulate(inst, policy, perf=perf, reconfig=reconfig, rounds=args.rounds, run_out=args.run_out,
                           seed=args.seed, progress=bar, out_dir=None, round_interval_s=args.round_interval,
                           max_rounds=args.max_rounds, outages=outages, shadow=shadow, stop=interrupt)
    except InputError as e:             # refused before the first round: named by its flag
        raise InputError(e.reason, file=e.file, line=e.line, field=SIM_FLAGS.get(e.field or "", e.field)) from None
    finally:
        if bar:
            bar.close()
    report_incomplete(res, "arena simulate")
    if args.plugins:                    # which plug-in code took part, by file hash
        res.summary["plugins"] = "; ".join(p.describe() for p in args.plugins)
    from ..metrics import write_result
    write_result(res, out)
    if not args.no_plots:
        from ..plots import write_plots
        write_plots(res, out)
    print(format_summary(res.summary))
    print(f"\nresults in {out}/ ({time.perf_counter() - t0:.1f} s)")
    if res.summary.get("end_reason") == "interrupted":
        s = res.summary
        print(f"arena simulate: interrupted (Ctrl-C) after {s['rounds_simulated']:,} rounds: the results so far are "
              f"in {out}/ (summary.json: end_reason 'interrupted'; jobs.csv and rounds.csv up to that round)",
              file=sys.stderr)
        return Interrupt.EXIT_STATUS
    return 0
