"""`arena train`: launch a real MPI + torch training job with a data x tensor x pipeline plan."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a catalog model under mpiexec with a dp x tp x pp plan",
        description="Launch dp*tp*pp ranks with mpiexec (MPICH), train a catalog model with torch "
                    "data/tensor/pipeline parallelism, checkpoint and resume (resharding to the new "
                    "plan). Each step prints 'step N loss L time_s T'.")
    p.add_argument("--model", required=True, help="catalog model, e.g. tiny-gpt__2L, or a Hugging Face-style config.json")
    p.add_argument("--plan", required=True, help="parallel degrees, e.g. dp=2,tp=1,pp=1")
    p.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per step (default: pp)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b", help="pipeline schedule")
    p.add_argument("--stage-layers", default="", help="decoder layers per stage, e.g. 1,3 (default: even)")
    p.add_argument("--steps", type=int, required=True, help="total steps (a resumed run continues to this)")
    p.add_argument("--global-batch", type=int, default=None, help="samples per step (default: dp*microbatches)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="Adam learning rate (default: 3e-3)")
    p.add_argument("--data", default=None, help="local text file read as bytes (default: synthetic tokens)")
    p.add_argument("--hostfile", default=None, help="MPICH hostfile (host[:slots] per line)")
    p.add_argument("--num-nodes", type=int, default=None, help="nodes the ranks span (default: hostfile hosts or 1)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--memory-device", default=None,
                   help="GPU catalog type whose memory the plan must fit (default: cpu, or h200 etc. on CUDA)")
    p.add_argument("--checkpoint-dir", default=None, help="resume from and save checkpoints here")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every K steps (0: only at end/stop)")
    p.add_argument("--telemetry", default=None, help="append every step's measured-run record to this JSONL file")
    p.add_argument("--telemetry-store", default=None,
                   help="profile store dir for measured_runs.jsonl (default: $ARENA_PROFILE_DIR or "
                        "~/.cache/arena/profiles)")
    p.add_argument("--no-record", action="store_true", help="do not append measured runs to the store")
    p.add_argument("--breakdown", action="store_true", help="record per-stage compute/communication time")
    p.add_argument("--run-dir", default=None, help="where config, logs and results go (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the job is stopped")
    p.add_argument("--dry-run", action="store_true", help="validate the plan and print the mpiexec command only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import tempfile
    from pathlib import Path

    from instances.errors import InputError
    from launcher.api import run_config
    from launcher.config import OptimizerConfig, ParallelPlan, TrainConfig
    from launcher.launch import build_command, hostfile_hosts
    from launcher.telemetry import store_dir
    from launcher.validate import validate

    degrees = ParallelPlan.parse(args.plan)
    try:
        stage_layers = tuple(int(v) for v in args.stage_layers.split(",") if v.strip())
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {args.stage_layers!r}",
                         field="--stage-layers") from None
    plan = ParallelPlan(dp=degrees.dp, tp=degrees.tp, pp=degrees.pp,
                        microbatches=args.microbatches or degrees.pp, schedule=args.schedule,
                        stage_layers=stage_layers)
    num_nodes = args.num_nodes or (len(hostfile_hosts(args.hostfile)) if args.hostfile else 1)
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="arena-train-")
    cfg = TrainConfig(
        model=args.model, plan=plan, steps=args.steps, global_batch=args.global_batch, seed=args.seed,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, run_dir=run_dir,
        progress_path=str(Path(run_dir) / "progress.json"),
        telemetry_store=None if args.no_record else str(store_dir(args.telemetry_store)),
        telemetry_path=args.telemetry, breakdown=args.breakdown, data_path=args.data,
        device=args.device, num_nodes=num_nodes,
        optimizer=OptimizerConfig(lr=args.lr) if args.lr is not None else OptimizerConfig())
    mem_device = args.memory_device or "cpu"
    mem = validate(cfg, device_type=mem_device)
    if args.dry_run:
        print(json.dumps({"plan": str(plan), "ranks": plan.world_size,
                          "memory_per_rank_bytes": mem.per_rank_bytes, "device_memory_bytes":
                          mem.device_memory_bytes, "command": build_command(cfg, Path(run_dir) / "config.json",
                                                                            args.hostfile)}, indent=1))
        return 0
    print(f"arena train: {cfg.model} plan {plan} microbatches {plan.microbatches} schedule "
          f"{plan.schedule} on {plan.world_size} ranks; run dir {run_dir}", flush=True)
    res = run_config(cfg, timeout_s=args.timeout, hostfile=args.hostfile, echo=True, device_type=mem_device)
    if res.returncode != 0:
        print(f"arena train: mpiexec exited with status {res.returncode}", flush=True)
        return 1
    if res.iteration_times_s:
        its = sorted(res.iteration_times_s[1:] or res.iteration_times_s)
        print(f"arena train: {len(res.steps)} steps from step {res.start_step}, median iteration "
              f"{its[len(its) // 2]:.4f} s, wall {res.wall_time_s:.1f} s", flush=True)
    return 0
