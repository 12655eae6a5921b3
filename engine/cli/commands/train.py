"""`arena train`: launch a real MPI + torch training job with a data x tensor x pipeline plan."""
from __future__ import annotations

import argparse

from ..common import seed_arg
from ..flags import fields_as_flags
from ..jsonout import dumps

# The flag that sets each field of the run's config (launcher/config.py: TrainConfig, its
# ParallelPlan and OptimizerConfig) and of the checks before launch (launcher/validate.py),
# for errors (tests/test_cli_flags.py walks it against the config's fields and the parser).
TRAIN_FLAGS = {
    "model": "--model", "plan": "--plan", "dp": "--plan", "tp": "--plan", "pp": "--plan",
    "plan.tp": "--plan", "plan.pp": "--plan", "microbatches": "--microbatches", "schedule": "--schedule",
    "stage_layers": "--stage-layers", "plan.stage_layers": "--stage-layers", "steps": "--steps",
    "global_batch": "--global-batch", "seed": "--seed", "lr": "--lr", "data_path": "--data", "data": "--data",
    "num_nodes": "--num-nodes", "device": "--device", "checkpoint_dir": "--checkpoint-dir",
    "checkpoint_every": "--checkpoint-every", "checkpoint_interval_s": "--checkpoint-interval",
    "stall_timeout_s": "--stall-timeout", "telemetry_path": "--telemetry", "telemetry_store": "--telemetry-store",
    "run_dir": "--run-dir", "step_delay_s": "--step-delay", "breakdown": "--breakdown",
}
# set by the launcher, not by a flag
TRAIN_NOT_FLAGS = frozenset({"checkpoint_keep", "checkpoint_at_end", "progress_path", "gpu_type", "gpus_per_node",
                             "comm_timeout_s", "optimizer", "beta1", "beta2", "eps", "data_roots"})


def register(subparsers) -> None:
    from launcher.datafile import MAX_DATA_BYTES
    from launcher.worker import NONFINITE_EXIT

    p = subparsers.add_parser(
        "train", help="train a catalog model under mpiexec with a dp x tp x pp plan",
        description="Launch dp*tp*pp ranks with mpiexec (MPICH), train a catalog model with torch "
                    "data/tensor/pipeline parallelism, checkpoint and resume (resharding to the new "
                    "plan). Each step prints 'step N loss L time_s T'. With --checkpoint-dir the run "
                    "saves periodically (by default about every tenth of the steps and at least every "
                    "10 minutes) and a rerun of the same command resumes from the latest checkpoint, on "
                    "any plan.")
    p.add_argument("--model", required=True,
                   help="catalog model, e.g. tiny-gpt__2L (list: arena models), or a Hugging Face-style config.json")
    p.add_argument("--plan", required=True, help="parallel degrees, e.g. dp=2,tp=1,pp=1")
    p.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per step (default: pp)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b", help="pipeline schedule")
    p.add_argument("--stage-layers", default="", help="decoder layers per stage, e.g. 1,3 (default: even)")
    p.add_argument("--steps", type=int, required=True,
                   help="total steps of the run (a resumed run continues up to this step)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="samples per step (default: the checkpoint's when resuming, else dp*microbatches)")
    p.add_argument("--seed", type=seed_arg, default=0, help="model initialisation and data seed (default 0)")
    p.add_argument("--lr", type=float, default=None,
                   help="Adam learning rate, a finite number > 0 (default: 3e-3); a run whose loss turns non-finite "
                        f"stops there, keeps its last finite checkpoint and exits with status {NONFINITE_EXIT}")
    p.add_argument("--data", default=None,
                   help="local file read as bytes, one token a byte (any content; at least the model's context + 2 "
                        f"bytes, at most {MAX_DATA_BYTES // 2**30} GiB; default: synthetic tokens)")
    p.add_argument("--hostfile", default=None, help="MPICH hostfile (host[:slots] per line)")
    p.add_argument("--num-nodes", type=int, default=None, help="nodes the ranks span (default: hostfile hosts or 1)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when torch sees a GPU, else CPU (default auto)")
    p.add_argument("--memory-device", default=None,
                   help="GPU catalog type whose memory the plan must fit (default: cpu, or h200 etc. on CUDA)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="resume from and save checkpoints here (created if missing)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                   help="save every K steps (default with --checkpoint-dir: steps/10; 0: no step-based saves)")
    p.add_argument("--checkpoint-interval", type=float, default=None, metavar="S",
                   help="also save when S seconds passed since the last save (default with --checkpoint-dir: "
                        "600; 0: off)")
    p.add_argument("--stall-timeout", type=float, default=None, metavar="S",
                   help="report and stop the job when no step finishes for S seconds (default 120)")
    p.add_argument("--telemetry", default=None, help="append every step's measured-run record to this JSONL file")
    p.add_argument("--telemetry-store", default=None,
                   help="profile store dir for measured_runs.jsonl (default: $ARENA_PROFILE_DIR or "
                        "~/.cache/arena/profiles)")
    p.add_argument("--no-record", action="store_true", help="do not append measured runs to the store")
    p.add_argument("--breakdown", action="store_true", help="record per-stage compute/communication time")
    p.add_argument("--run-dir", default=None,
                   help="where config, logs and results go (default: a temporary folder, removed after a "
                        "successful run); an earlier launch's files there move to previous/<n>/")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the job is stopped (default 3600)")
    p.add_argument("--step-delay", type=float, default=0.0, metavar="S",
                   help="sleep S seconds after each step (demos and tests: slow a tiny run down)")
    p.add_argument("--dry-run", action="store_true", help="validate the plan and print the mpiexec command only")
    p.set_defaults(func=run)


def _build_config(args, run_dir: str):
    from pathlib import Path

    from instances.errors import InputError
    from instances.limits import check_time
    from launcher.api import checkpoint_global_batch
    from launcher.config import DEFAULT_STALL_TIMEOUT_S, OptimizerConfig, ParallelPlan, TrainConfig
    from launcher.launch import hostfile_hosts
    from launcher.telemetry import store_dir

    degrees = ParallelPlan.parse(args.plan)
    try:
        stage_layers = tuple(int(v) for v in args.stage_layers.split(",") if v.strip())
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {args.stage_layers!r}",
                         field="--stage-layers") from None
    plan = ParallelPlan(dp=degrees.dp, tp=degrees.tp, pp=degrees.pp,
                        microbatches=degrees.pp if args.microbatches is None else args.microbatches,
                        schedule=args.schedule,
                        stage_layers=stage_layers)
    if args.num_nodes is not None and args.num_nodes < 1:
        raise InputError(f"must be >= 1, got {args.num_nodes}", field="--num-nodes")
    num_nodes = args.num_nodes if args.num_nodes is not None else \
        (len(hostfile_hosts(args.hostfile)) if args.hostfile else 1)
    if args.checkpoint_dir:
        from instances.paths import check_output_dir
        check_output_dir(args.checkpoint_dir, "--checkpoint-dir")       # before reading it
    global_batch = args.global_batch if args.global_batch is not None else \
        checkpoint_global_batch(args.checkpoint_dir)
    if not args.timeout > 0:
        raise InputError(f"must be > 0 seconds, got {args.timeout}", field="--timeout")
    check_time(args.timeout, field="--timeout")
    return TrainConfig(
        model=args.model, plan=plan, steps=args.steps, global_batch=global_batch, seed=args.seed,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        checkpoint_interval_s=args.checkpoint_interval, run_dir=run_dir,
        progress_path=str(Path(run_dir) / "progress.json"),
        telemetry_store=None if args.no_record else str(store_dir(args.telemetry_store)),
        telemetry_path=args.telemetry, breakdown=args.breakdown, data_path=args.data,
        device=args.device, num_nodes=num_nodes, step_delay_s=args.step_delay,
        stall_timeout_s=DEFAULT_STALL_TIMEOUT_S if args.stall_timeout is None else args.stall_timeout,
        optimizer=OptimizerConfig(lr=args.lr) if args.lr is not None else OptimizerConfig())


def checkpoint_plan_line(cfg) -> str:
    """Where and how often the run checkpoints, said at start."""
    if not cfg.checkpoint_dir:
        return "no --checkpoint-dir: nothing is saved, a killed run loses every step"
    when = [f"every {cfg.checkpoint_every} steps"] if cfg.checkpoint_every else []
    if cfg.checkpoint_interval_s:
        when.append(f"every {cfg.checkpoint_interval_s:.0f} s")
    when.append("at the end")
    return f"checkpoints in {cfg.checkpoint_dir}: {', '.join(when)} (the last {cfg.checkpoint_keep} kept)"


def run(args: argparse.Namespace) -> int:
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from launcher.api import TEMP_PREFIX, run_config
    from launcher.checkpoint import latest_checkpoint, read_meta
    from launcher.launch import build_command
    from launcher.validate import validate
    from launcher.worker import NONFINITE_EXIT

    own_tmp = args.run_dir is None
    run_dir = args.run_dir or tempfile.mkdtemp(prefix=TEMP_PREFIX)
    try:
        with fields_as_flags(TRAIN_FLAGS):
            cfg = _build_config(args, run_dir)
        with fields_as_flags({**TRAIN_FLAGS, "gpu_type": "--memory-device"}):
            mem = validate(cfg, device_type=args.memory_device or "cpu")
    except BaseException:
        if own_tmp:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    plan = cfg.plan
    if args.dry_run:                    # (a temporary run folder is removed below: the command names a stand-in)
        where = Path("<run-dir>") if own_tmp else Path(run_dir)
        print(dumps({"plan": str(plan), "ranks": plan.world_size,
                     "memory_per_rank_bytes": mem.per_rank_bytes, "device_memory_bytes": mem.device_memory_bytes,
                     "command": build_command(cfg, where / "config.json", args.hostfile)}, indent=1))
        if own_tmp:
            shutil.rmtree(run_dir, ignore_errors=True)
        return 0
    found = latest_checkpoint(cfg.checkpoint_dir)
    if found is not None:
        meta = read_meta(found[1])
        if found[0] >= cfg.steps:
            print(f"arena train: the checkpoint in {cfg.checkpoint_dir} is at step {found[0]}, at or past "
                  f"--steps {cfg.steps}: nothing to train (--steps is the total, not the steps to add; "
                  f"pass --steps {found[0] + cfg.steps} to train {cfg.steps} more)", flush=True)
            if own_tmp:
                shutil.rmtree(run_dir, ignore_errors=True)
            return 0
        print(f"arena train: resuming from step {found[0]} (checkpoint {found[1]}, saved on plan "
              f"{meta.get('plan')}, global batch {meta.get('global_batch')})", flush=True)
    print(f"arena train: {cfg.model} plan {plan} microbatches {plan.microbatches} schedule "
          f"{plan.schedule} on {plan.world_size} ranks, global batch {cfg.global_batch}, steps "
          f"{found[0] if found else 0} -> {cfg.steps}; run dir {run_dir}", flush=True)
    print(f"arena train: {checkpoint_plan_line(cfg)}", flush=True)
    previous = [p for p in ("results.jsonl", "events.jsonl") if (Path(run_dir) / p).exists()]
    res = run_config(cfg, timeout_s=args.timeout, hostfile=args.hostfile, echo=True,
                     device_type=args.memory_device or "cpu")
    if previous:
        print(f"arena train: the run dir held an earlier launch's files; they are in {run_dir}/previous/",
              flush=True)
    if res.returncode != 0:
        print(f"arena train: {res.failure}; logs in {run_dir}", file=sys.stderr, flush=True)
        return NONFINITE_EXIT if res.returncode == NONFINITE_EXIT else 1
    if res.iteration_times_s:
        its = sorted(res.iteration_times_s[1:] or res.iteration_times_s)
        print(f"arena train: {len(res.steps)} steps from step {res.start_step}, median iteration "
              f"{its[len(its) // 2]:.4f} s, wall {res.wall_time_s:.1f} s", flush=True)
    return 0
