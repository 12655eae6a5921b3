"""One rank of a launched training job: ``python -m launcher.worker CONFIG.json`` under mpiexec.

Builds the plain model, applies the plan (pipeline split, tensor sharding, data
parallelism), resumes from the latest checkpoint if any, and trains to ``steps``.
Rank 0 prints one line per step (``step N loss L time_s T``) and writes the run's
results, events, telemetry and progress files.

Control: SIGTERM (mpiexec forwards it to every rank) or a ``stop`` file in the run
directory -> checkpoint at the end of the current step and exit 0 with status
"stopped"; SIGUSR1 or a ``checkpoint`` file -> checkpoint and continue. All ranks agree
on these flags through the per-step all-reduce that also carries the loss, so they save
at the same step.
"""
from __future__ import annotations

import time

_T_START = time.time()          # before importing torch: process start, for the init cost

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402

STOP_FILE = "stop"
CHECKPOINT_FILE = "checkpoint"
RESULTS_FILE = "results.jsonl"
EVENTS_FILE = "events.jsonl"
PIDS_DIR = "pids"
EXITS_DIR = "exits"                   # rank<r>: written when the rank leaves main() (post-mortem)
EXIT_LINGER_S = 0.3                   # pause between MPI_Finalize and os._exit (see __main__)


class _Flags:
    stop = False
    save = False


def _on_sigterm(*_):
    _Flags.stop = True


def _on_sigusr1(*_):
    _Flags.save = True


def _device_names(device) -> tuple[str, str]:
    """(device description, catalog GPU type) for telemetry."""
    import torch

    if device.type == "cuda":
        from instances.errors import InputError
        from instances.gpus import canonical_gpu_name

        name = torch.cuda.get_device_name(device)
        short = name.lower().removeprefix("nvidia").strip().split()[0] if name.strip() else name
        try:
            return f"cuda:{name}", canonical_gpu_name(short)
        except InputError:
            return f"cuda:{name}", name
    return "cpu", "cpu"


def main(config_path: str) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGUSR1, _on_sigusr1)
    import torch
    import torch.distributed as dist

    from . import checkpoint, telemetry
    from .config import TrainConfig
    from .data import dp_shard, make_source
    from .dist import init_distributed
    from .model import build_model, loss_fn
    from .parallelize import apply_dp, apply_tp
    from .pipeline import build_schedule, split_stage

    # torch's distributed packages up front, so the "import" part of start-up holds them all
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401

    torch.set_num_threads(1)
    t_imported = time.time()
    cfg = TrainConfig.read(config_path)
    run_dir = Path(cfg.run_dir)

    env = init_distributed(cfg)
    t_rendezvous = time.time()
    rank, plan = env.rank, cfg.plan
    (run_dir / PIDS_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / PIDS_DIR / f"rank{rank}").write_text(f"{os.getpid()} {env.hostname}")
    is_first, is_last = env.pp_rank == 0, env.pp_rank == plan.pp - 1

    def event(name: str, **kw):
        if rank == 0:
            telemetry.append_jsonl(run_dir / EVENTS_FILE, [{"event": name, "time": time.time(), **kw}])

    def leave(status: str, done: int) -> int:
        (run_dir / EXITS_DIR).mkdir(exist_ok=True)
        (run_dir / EXITS_DIR / f"rank{rank}").write_text(f"{status} {done}")
        return 0

    def progress(status: str, done: int, last_ckpt: int | None, it_s: float | None, **kw):
        if rank == 0 and cfg.progress_path:
            telemetry.write_progress(cfg.progress_path, status=status, iterations_done=done,
                                     steps_total=cfg.steps, last_checkpoint_step=last_ckpt,
                                     iteration_time_s=it_s, mpiexec_ppid=os.getppid(), **kw)

    # --- model and parallelism -------------------------------------------------------
    model = split_stage(build_model(cfg.model, cfg.seed), env.pp_rank, plan.pp, plan.stage_layers)
    model.to(env.device)
    if plan.tp > 1:
        apply_tp(model, env.mesh["tp"])
    train_module = model
    if plan.dp > 1:
        train_module = apply_dp(model, env.mesh["dp"], use_fsdp=plan.tp > 1 or plan.pp > 1, device=env.device)
    opt_cfg = cfg.optimizer
    optimizer = torch.optim.Adam(train_module.parameters(), lr=opt_cfg.lr,
                                 betas=(opt_cfg.beta1, opt_cfg.beta2), eps=opt_cfg.eps)
    timer = telemetry.ComputeTimer(model) if cfg.breakdown else None
    identity = {"model": cfg.model, "seed": cfg.seed, "global_batch": cfg.global_batch}

    # --- resume ------------------------------------------------------------------------
    start_step, last_ckpt = 0, None
    found = checkpoint.latest_checkpoint(cfg.checkpoint_dir)
    if found is not None:
        t0 = time.perf_counter()
        meta = checkpoint.load(found[1], train_module, optimizer, identity)
        start_step = last_ckpt = int(meta["step"])
        event("load", step=start_step, duration_s=time.perf_counter() - t0, path=str(found[1]),
              saved_plan=meta.get("plan"))
    if start_step >= cfg.steps:
        event("nothing_to_do", step=start_step)
        progress("finished", start_step, last_ckpt, None)
        return leave("finished", start_step)

    schedule = None
    if plan.pp > 1:
        schedule = build_schedule(train_module, env.pp_rank, plan.pp, env.device,
                                  env.mesh["pp"].get_group(), microbatches=plan.microbatches,
                                  schedule=plan.schedule, loss_fn=loss_fn)
    data = make_source(model.arch, cfg.seed, cfg.data_path)
    event("ready", init_s=time.time() - _T_START, import_s=t_imported - _T_START,
          rendezvous_s=t_rendezvous - t_imported, start_step=start_step, plan=str(plan),
          world_size=env.world_size, device=str(env.device))
    device_desc, gpu_type = _device_names(env.device)
    gpu_type = cfg.gpu_type or gpu_type

    def save(step: int, why: str) -> int:
        t0 = time.perf_counter()
        checkpoint.save(cfg.checkpoint_dir, step, train_module, optimizer,
                        {**identity, "plan": str(plan)}, rank=rank, barrier=dist.barrier,
                        keep=cfg.checkpoint_keep)
        event("save", step=step, why=why, duration_s=time.perf_counter() - t0)
        return step

    # a stop requested during start-up: exit before training (nothing new to save)
    if rank == 0 and (run_dir / STOP_FILE).exists():
        _Flags.stop = True
    early = torch.tensor([float(_Flags.stop)], device=env.device)
    dist.all_reduce(early)
    if early.item() > 0:
        progress("stopped", start_step, last_ckpt, None)
        event("stopped", step=start_step)
        return leave("stopped", start_step)

    progress("running", start_step, last_ckpt, None)
    it_s = None
    status = "finished"
    done = start_step
    for step in range(start_step, cfg.steps):
        if timer is not None:
            dist.barrier()          # breakdown: every rank's step starts together
            timer.take()
        t0 = time.perf_counter()
        x, y = (t.to(env.device) for t in dp_shard(data.global_batch(step, cfg.global_batch), plan.dp,
                                                   env.dp_rank))
        optimizer.zero_grad(set_to_none=True)
        local_loss = torch.zeros((), device=env.device)
        if schedule is not None:
            losses: list = []
            if is_first:
                schedule.step(x)
            elif is_last:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
            if is_last:
                local_loss = torch.stack([l.detach() for l in losses]).mean()
        else:
            K = plan.microbatches
            for i, (xi, yi) in enumerate(zip(x.chunk(K), y.chunk(K))):
                sync = i == K - 1 or not hasattr(train_module, "no_sync")
                with nullcontext() if sync else train_module.no_sync():
                    loss = loss_fn(train_module(xi), yi) / K
                    loss.backward()
                local_loss += loss.detach()
        t_opt = time.perf_counter()
        optimizer.step()
        opt_s = time.perf_counter() - t_opt
        # loss (summed over data replicas' last-stage, tensor-rank-0 ranks) + control flags
        if rank == 0 and (run_dir / STOP_FILE).exists():
            _Flags.stop = True
        if rank == 0 and (run_dir / CHECKPOINT_FILE).exists():
            (run_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
            _Flags.save = True
        contrib = local_loss / plan.dp if (is_last and env.tp_rank == 0) else torch.zeros_like(local_loss)
        ctl = torch.stack([contrib.float(), torch.tensor(float(_Flags.stop), device=env.device),
                           torch.tensor(float(_Flags.save), device=env.device)])
        dist.all_reduce(ctl)
        it_s = time.perf_counter() - t0
        loss_val, stop, save_req = float(ctl[0]), bool(ctl[1] > 0), bool(ctl[2] > 0)
        done = step + 1
        stage_compute = stage_comm = None
        if timer is not None:
            compute = timer.take() + opt_s
            gathered: list = [None] * env.world_size
            dist.all_gather_object(gathered, (env.pp_rank, compute))
            stage_compute = [max(c for p, c in gathered if p == s) for s in range(plan.pp)]
            stage_comm = [max(0.0, it_s - c) for c in stage_compute]
        if rank == 0:
            print(f"step {done} loss {loss_val:.6f} time_s {it_s:.4f}", flush=True)
            telemetry.append_jsonl(run_dir / RESULTS_FILE, [{"step": done, "loss": loss_val,
                                                             "iteration_time_s": it_s,
                                                             "time": time.time()}])
            rec = telemetry.measured_run(cfg, device=device_desc, gpu_type=gpu_type,
                                         iteration_time_s=it_s, step=done,
                                         stage_compute_s=stage_compute, stage_comm_s=stage_comm)
            if cfg.telemetry_path:
                telemetry.append_jsonl(cfg.telemetry_path, [rec])
            if cfg.telemetry_store and step > start_step:          # first step: warm-up
                telemetry.append_measured_runs(Path(cfg.telemetry_store), [rec])
        if cfg.checkpoint_dir and (stop or save_req or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            last_ckpt = save(done, "stop" if stop else "request" if save_req else "periodic")
            _Flags.save = False
        progress("running", done, last_ckpt, it_s)
        if stop:
            status = "stopped"
            break
        if cfg.step_delay_s:
            time.sleep(cfg.step_delay_s)
    else:
        if cfg.checkpoint_dir and cfg.checkpoint_at_end and last_ckpt != cfg.steps:
            last_ckpt = save(cfg.steps, "end")
    if rank == 0:
        (run_dir / STOP_FILE).unlink(missing_ok=True)
    progress(status, done, last_ckpt, it_s)
    event(status, step=done)
    # No dist.destroy_process_group(): every rank has left its last collective, and
    # os._exit in __main__ closes the sockets (a finished run that still ended non-zero was
    # Hydra SIGKILLing a rank during the exit: see the linger in __main__).
    return leave(status, done)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m launcher.worker CONFIG.json", file=sys.stderr)
        sys.exit(2)
    try:
        code = main(sys.argv[1])
    except Exception as exc:  # report, then fail the whole MPI job
        import traceback

        traceback.print_exc()
        print(f"launcher.worker: rank failed: {exc!r}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    # Skip the interpreter's slow teardown of torch (about 1.5 s per rank here): finalize
    # MPI explicitly, flush, linger, and leave. Without the linger, about one 4-rank launch
    # in six here ended with one rank SIGKILLed by Hydra after every rank had recorded
    # leaving the training loop (exit codes 0,0,9,0; 4 of 25 runs); with it, 0 of 28.
    from mpi4py import MPI

    MPI.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(EXIT_LINGER_S)
    os._exit(code)
