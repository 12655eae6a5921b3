"""What several commands share: the flags they have in common (workload, policy and its
options, shadow policy, performance model, outages, seed) and what they build from them
(the instance, the policy, the performance model), each refusal named by its flag. A
command imports these from here, never from another command."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from instances.errors import InputError

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


def add_shadow_args(p) -> None:
    p.add_argument("--shadow-policy", default=None, metavar="NAME",
                   help="a second policy asked every round on the same state and compared with the one that "
                        "decides; never carried out (engine/core/shadow.py)")
    p.add_argument("--shadow-policy-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="the shadow policy's options (repeatable)")


def build_policy(name: str, opts: dict, *, name_flag: str = "--policy", opt_flag: str = "--policy-opt"):
    """The policy ``name`` built from ``opts``; an unknown name is an ``InputError`` on
    ``name_flag``, a refused option one on ``opt_flag`` (the policy's own message names the
    policy and the key, said once)."""
    from engine.core.policy import make_policy, policy_lacks, policy_names
    if name not in policy_names():
        raise InputError(f"unknown policy {name!r}; known: {', '.join(policy_names())}", field=name_flag)
    try:
        policy = make_policy(name, **opts)
    except (TypeError, ValueError) as e:
        if not opts and not isinstance(e, InputError):     # no option given: the policy's own failure
            raise InputError(f"policy {name!r}{_defined_in(name)} could not be built: {type(e).__name__}: "
                             f"{e}{_raised_at(e)}", field=name_flag) from None
        raise _option_error(name, e, opt_flag) from None
    lacks = policy_lacks(policy)
    if "decide(ctx)" in lacks:
        raise InputError(f"policy {name!r}{_defined_in(name)} built a {type(policy).__name__} object, which has "
                         "no decide(ctx) method", field=name_flag)
    if lacks:
        raise InputError(f"policy {name!r}{_defined_in(name)} built a {type(policy).__name__} object, which lacks "
                         f"{', '.join(lacks)} (subclass engine.core.policy.Policy for the defaults)", field=name_flag)
    return policy


def _option_error(name: str, e: ValueError, opt_flag: str) -> InputError:
    """A policy's refusal of its options as an ``InputError`` on ``opt_flag``, naming the
    policy and the option (said once)."""
    reason = e.reason if isinstance(e, InputError) else str(e)
    if not reason.startswith(f"policy {name!r}"):
        reason = f"policy {name!r}: {reason}"
    if isinstance(e, InputError) and e.field and e.field not in reason:
        reason += f" (option {e.field})"
    return InputError(reason, field=opt_flag)


def instance_workload(inst, *, run_out: bool, round_interval_s: float | None = None):
    """What a policy will decide for on ``inst`` (``engine.core.policy.Workload``): its jobs'
    kind, its truth and, in a run-out, how long the simulator waits with jobs queued and
    nothing running before it stops as stalled."""
    from engine.core.policy import Workload
    from engine.sim.simulator import SimConfig
    interval = round_interval_s if round_interval_s is not None else inst.round_interval_s
    return Workload.of_jobs(f"instance {inst.name!r}", inst.jobs, truth=inst.oracle,
                            idle_limit_s=SimConfig.stall_rounds * interval if run_out else None)


def check_policy_on(policy, workload, *, name_flag: str = "--policy", opt_flag: str = "--policy-opt") -> None:
    """``engine.core.policy.check_policy_for`` before any work: a policy that cannot decide
    ``workload`` is refused on ``name_flag``, an option it would not read there on ``opt_flag``."""
    from engine.core.policy import check_policy_for
    try:
        check_policy_for(policy, workload)
    except InputError as e:
        if e.field == "--policy":
            raise InputError(e.reason, field=name_flag) from None
        raise _option_error(policy.name, e, opt_flag) from None


def _defined_in(name: str) -> str:
    """' (defined in FILE)' of a registered policy's factory, when it is not one of ours
    (a plug-in's policy names its file)."""
    import inspect

    from engine.core.policy import POLICIES
    try:
        file = inspect.getsourcefile(POLICIES.get(name))
    except (TypeError, InputError):
        return ""
    return "" if file is None or "/engine/decide/policies/" in file.replace("\\", "/") else f" (defined in {file})"


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
    if profile_store is not None:
        import stat

        from instances.paths import stat_path
        st = stat_path(Path(profile_store), "--profile-store")     # (a name too long: named, not an OSError)
        if st is not None and not stat.S_ISDIR(st.st_mode):
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
    from engine.core.reconfig import ReconfigCostModel
    from instances.goodput import GoodputOracle
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


# simulate()'s parameters as the flags that set them
SIM_FLAGS = {"rounds": "--rounds", "max_rounds": "--max-rounds", "round_interval_s": "--round-interval"}


def check_batch(batch: int) -> None:
    """``--batch`` (estimate, profile): a global batch within the catalog's bound."""
    from instances.jobs import MAX_GLOBAL_BATCH
    if not 1 <= batch <= MAX_GLOBAL_BATCH:
        raise InputError(f"must be in 1..{MAX_GLOBAL_BATCH:,} samples (a thousand times the largest measured batch), "
                         f"got {batch:,}", field="--batch")
