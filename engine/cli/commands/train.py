"""`arena train`: launch a real MPI + torch training job with a data x tensor x pipeline plan."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..common import seed_arg
from ..flags import add_config_flags, config_flags, config_values, fields_as_flags
from ..jsonout import dumps

# set by the launcher, not by a flag
TRAIN_NOT_FLAGS = frozenset({"checkpoint_keep", "checkpoint_at_end", "progress_path", "gpu_type", "gpus_per_node",
                             "comm_timeout_s", "optimizer", "beta1", "beta2", "eps", "data_roots"})


def _lr_help() -> str:
    from launcher.worker import NONFINITE_EXIT
    return ("Adam learning rate, a finite number > 0 (default: 3e-3); a run whose loss turns non-finite stops "
            f"there, keeps its last finite checkpoint and exits with status {NONFINITE_EXIT}")


def _data_help() -> str:
    from launcher.datafile import MAX_DATA_BYTES
    return ("local file read as bytes, one token a byte (any content; at least the model's context + 2 bytes, at "
            f"most {MAX_DATA_BYTES // 2**30} GiB; default: synthetic tokens)")


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """``arena train``'s options as typed, each field carrying its flag (``--help`` lists
    them in this order; engine/cli/flags.py); ``_build_config`` makes the run's validated
    ``TrainConfig`` from them (its errors named by ``TRAIN_FLAGS``)."""
    model: str = field(metadata={
        "flag": "--model", "required": True,
        "help": "catalog model, e.g. tiny-gpt__2L (list: arena models), or a Hugging Face-style config.json"})
    plan: str = field(metadata={"flag": "--plan", "required": True,
                                "help": "parallel degrees, e.g. dp=2,tp=1,pp=1"})
    microbatches: int | None = field(default=None, metadata={
        "flag": "--microbatches", "help": "micro-batches per step (default: pp)"})
    schedule: str = field(default="1f1b", metadata={"flag": "--schedule", "choices": ("gpipe", "1f1b"),
                                                    "help": "pipeline schedule"})
    stage_layers: str | None = field(default=None, metadata={
        "flag": "--stage-layers", "help": "decoder layers per stage, e.g. 1,3 (default: even)"})
    steps: int = field(metadata={"flag": "--steps", "required": True,
                                 "help": "total steps of the run (a resumed run continues up to this step)"})
    global_batch: int | None = field(default=None, metadata={
        "flag": "--global-batch",
        "help": "samples per step (default: the checkpoint's when resuming, else dp*microbatches)"})
    seed: int = field(default=0, metadata={"flag": "--seed", "type": seed_arg,
                                           "help": "model initialisation and data seed (default %(default)s)"})
    lr: float | None = field(default=None, metadata={"flag": "--lr", "help": _lr_help})
    data: str | None = field(default=None, metadata={"flag": "--data", "help": _data_help})
    hostfile: str | None = field(default=None, metadata={"flag": "--hostfile",
                                                         "help": "MPICH hostfile (host[:slots] per line)"})
    num_nodes: int | None = field(default=None, metadata={
        "flag": "--num-nodes", "help": "nodes the ranks span (default: hostfile hosts or 1)"})
    device: str = field(default="auto", metadata={
        "flag": "--device", "choices": ("auto", "cpu", "cuda"),
        "help": "auto: CUDA when torch sees a GPU, else CPU (default auto)"})
    memory_device: str | None = field(default=None, metadata={
        "flag": "--memory-device",
        "help": "GPU catalog type whose memory the plan must fit (default: cpu, or h200 etc. on CUDA)"})
    checkpoint_dir: str | None = field(default=None, metadata={
        "flag": "--checkpoint-dir", "help": "resume from and save checkpoints here (created if missing)"})
    checkpoint_every: int | None = field(default=None, metadata={
        "flag": "--checkpoint-every", "metavar": "K",
        "help": "save every K steps (default with --checkpoint-dir: steps/10; 0: no step-based saves)"})
    checkpoint_interval_s: float | None = field(default=None, metadata={
        "flag": "--checkpoint-interval", "metavar": "S",
        "help": "also save when S seconds passed since the last save (default with --checkpoint-dir: 600; 0: off)"})
    stall_timeout_s: float | None = field(default=None, metadata={
        "flag": "--stall-timeout", "metavar": "S",
        "help": "report and stop the job when no step finishes for S seconds (default 120)"})
    telemetry: str | None = field(default=None, metadata={
        "flag": "--telemetry", "help": "append every step's measured-run record to this JSONL file"})
    telemetry_store: str | None = field(default=None, metadata={
        "flag": "--telemetry-store",
        "help": "profile store dir for measured_runs.jsonl (default: $ARENA_PROFILE_DIR or ~/.cache/arena/profiles)"})
    no_record: bool = field(default=False, metadata={
        "flag": "--no-record", "help": "do not append measured runs to the store"})
    breakdown: bool = field(default=False, metadata={
        "flag": "--breakdown", "help": "record per-stage compute/communication time"})
    run_dir: str | None = field(default=None, metadata={
        "flag": "--run-dir",
        "help": "where config, logs and results go (default: a temporary folder, removed after a successful run); "
                "an earlier launch's files there move to previous/<n>/"})
    timeout_s: float = field(default=3600.0, metadata={
        "flag": "--timeout", "help": "seconds before the job is stopped (default 3600)"})
    step_delay_s: float = field(default=0.0, metadata={
        "flag": "--step-delay", "metavar": "S",
        "help": "sleep S seconds after each step (demos and tests: slow a tiny run down)"})
    dry_run: bool = field(default=False, metadata={
        "flag": "--dry-run", "help": "validate the plan and print the mpiexec command only"})


# The flag that sets each field of the run's config (launcher/config.py: TrainConfig, its
# ParallelPlan and OptimizerConfig) and of the checks before launch (launcher/validate.py),
# for errors: TrainOptions' own (most of the config's fields are named as the options that
# set them) and the config's other names (tests/test_cli_flags.py walks it against the
# config's fields and the parser).
TRAIN_FLAGS = {**config_flags(TrainOptions), "dp": "--plan", "tp": "--plan", "pp": "--plan", "plan.tp": "--plan",
               "plan.pp": "--plan", "plan.stage_layers": "--stage-layers", "data_path": "--data",
               "telemetry_path": "--telemetry", "host_addrs": "--hostfile"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a catalog model under mpiexec with a dp x tp x pp plan",
        description="Launch dp*tp*pp ranks with mpiexec (MPICH), train a catalog model with torch "
                    "data/tensor/pipeline parallelism, checkpoint and resume (resharding to the new "
                    "plan). Each step prints 'step N loss L time_s T'. With --checkpoint-dir the run "
                    "saves periodically (by default about every tenth of the steps and at least every "
                    "10 minutes) and a rerun of the same command resumes from the latest checkpoint, on "
                    "any plan.")
    add_config_flags(p, TrainOptions)
    p.set_defaults(func=run)


def _build_config(o: TrainOptions, run_dir: str):
    """The run's ``TrainConfig`` from the options (errors name fields: the caller renames
    them by ``TRAIN_FLAGS``)."""
    from pathlib import Path

    from instances.errors import InputError
    from instances.limits import check_time
    from launcher.api import checkpoint_global_batch
    from launcher.config import DEFAULT_STALL_TIMEOUT_S, OptimizerConfig, ParallelPlan, TrainConfig
    from launcher.launch import hostfile_hosts
    from launcher.telemetry import store_dir

    degrees = ParallelPlan.parse(o.plan)
    try:                        # (given empty: refused by its flag, as every empty value; main.py)
        stage_layers = () if o.stage_layers is None else tuple(int(v) for v in o.stage_layers.split(","))
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {o.stage_layers!r}",
                         field="stage_layers") from None
    plan = ParallelPlan(dp=degrees.dp, tp=degrees.tp, pp=degrees.pp,
                        microbatches=degrees.pp if o.microbatches is None else o.microbatches,
                        schedule=o.schedule,
                        stage_layers=stage_layers)
    if o.num_nodes is not None and o.num_nodes < 1:
        raise InputError(f"must be >= 1, got {o.num_nodes}", field="num_nodes")
    num_nodes = o.num_nodes if o.num_nodes is not None else \
        (len(hostfile_hosts(o.hostfile)) if o.hostfile else 1)
    if o.checkpoint_dir:
        from instances.paths import check_output_dir
        check_output_dir(o.checkpoint_dir, "checkpoint_dir")       # before reading it
    global_batch = o.global_batch if o.global_batch is not None else \
        checkpoint_global_batch(o.checkpoint_dir)
    if not o.timeout_s > 0:
        raise InputError(f"must be > 0 seconds, got {o.timeout_s}", field="timeout_s")
    check_time(o.timeout_s, field="timeout_s")
    return TrainConfig(
        model=o.model, plan=plan, steps=o.steps, global_batch=global_batch, seed=o.seed,
        checkpoint_dir=o.checkpoint_dir, checkpoint_every=o.checkpoint_every,
        checkpoint_interval_s=o.checkpoint_interval_s, run_dir=run_dir,
        progress_path=str(Path(run_dir) / "progress.json"),
        telemetry_store=None if o.no_record else str(store_dir(o.telemetry_store)),
        telemetry_path=o.telemetry, breakdown=o.breakdown, data_path=o.data,
        device=o.device, num_nodes=num_nodes, step_delay_s=o.step_delay_s,
        stall_timeout_s=DEFAULT_STALL_TIMEOUT_S if o.stall_timeout_s is None else o.stall_timeout_s,
        optimizer=OptimizerConfig(lr=o.lr) if o.lr is not None else OptimizerConfig())


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

    o = TrainOptions(**config_values(args, TrainOptions))
    own_tmp = o.run_dir is None
    run_dir = o.run_dir or tempfile.mkdtemp(prefix=TEMP_PREFIX)
    try:
        with fields_as_flags(TRAIN_FLAGS):
            cfg = _build_config(o, run_dir)
        with fields_as_flags({**TRAIN_FLAGS, "gpu_type": "--memory-device"}):
            mem = validate(cfg, device_type=o.memory_device or "cpu")
    except BaseException:
        if own_tmp:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    plan = cfg.plan
    if o.dry_run:                    # (a temporary run folder is removed below: the command names a stand-in)
        where = Path("<run-dir>") if own_tmp else Path(run_dir)
        print(dumps({"plan": str(plan), "ranks": plan.world_size,
                     "memory_per_rank_bytes": mem.per_rank_bytes, "device_memory_bytes": mem.device_memory_bytes,
                     "command": build_command(cfg, where / "config.json", o.hostfile)}, indent=1))
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
    res = run_config(cfg, timeout_s=o.timeout_s, hostfile=o.hostfile, echo=True,
                     device_type=o.memory_device or "cpu")
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
