"""One rank of a launched training job: ``python -m launcher.worker CONFIG.json`` under mpiexec.

Builds the plain model, applies the plan (pipeline split, tensor sharding, data
parallelism), resumes from the latest checkpoint if any, and trains to ``steps``.
Rank 0 prints one line per step (``step N loss L time_s T``) and writes the run's
results, events, telemetry and progress files.

Non-finite training: a step whose loss is not finite (nan, inf; every rank sees the same
all-reduced loss) ends the run before anything is saved, and a save whose weights or
optimizer state hold a non-finite value on any rank (one all-reduced flag) is not made:
the last checkpoint, all finite, is kept. The progress file says status ``nonfinite`` with the
reason (one line naming the step and that checkpoint; ``arena train`` prints it, the
service fails the job with it), and every rank exits with ``NONFINITE_EXIT``.

Control: SIGTERM (mpiexec forwards it to every rank) or a ``stop`` file in the run
directory -> checkpoint at the end of the current step and exit 0 with status
"stopped". A launch superseded by a newer one of the same job (the job folder's
``current_launch`` names another run folder: ranks the executor could not reach and
gave up on, e.g. on a host cut off, which a relaunch elsewhere replaced) leaves at the
end of its step with status "superseded", saving and recording nothing: the job's
checkpoints and progress are the new launch's alone (rank 0 reads the fence again right
before each progress write and before committing a checkpoint, so a step agreed on, or a
save begun, just before the fence leaves nothing either). SIGUSR1 or a ``checkpoint``
file -> checkpoint and continue. Periodic checkpoints: every ``checkpoint_every`` steps
and whenever ``checkpoint_interval_s`` seconds have passed since the last save (rank 0's
clock decides). All ranks agree on these flags through the per-step all-reduce that also
carries the loss, so they save at the same step.
"""
from __future__ import annotations

import time

_T_START = time.time()          # before importing torch: process start, for the init cost

import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402

from . import d2d  # noqa: E402  (no torch at import)
from . import reshard_plan as rp  # noqa: E402
from .telemetry import NONFINITE  # noqa: E402  (no torch at import)

STOP_FILE = "stop"
CHECKPOINT_FILE = "checkpoint"
CURRENT_FILE = "current_launch"        # in the job's folder (beside progress.json): the run folder of its launch
RESULTS_FILE = "results.jsonl"
EVENTS_FILE = "events.jsonl"
PIDS_DIR = "pids"
EXITS_DIR = "exits"                   # rank<r>: written when the rank leaves main() (post-mortem)
EXIT_LINGER_S = 0.3                   # pause between MPI_Finalize and os._exit (see __main__)
NONFINITE_EXIT = 3                    # every rank's exit status then (mpiexec's too)


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


class RankRun:
    """One rank's training run, in parts that read alone: ``setup`` (distributed
    environment, model, plan, optimizer), ``resume`` (latest checkpoint), ``step`` (one
    optimizer step, timed), ``agree`` (loss and control flags, all-reduced), ``record``
    (rank 0: step line, results, telemetry) and ``save``; ``main`` runs the loop (a test
    can run the parts alone, one rank in its own process)."""

    def __init__(self, cfg, env, t_imported: float, t_rendezvous: float):
        from . import telemetry

        self.cfg, self.env, self.plan, self.rank = cfg, env, cfg.plan, env.rank
        self.run_dir = Path(cfg.run_dir)
        self.telemetry = telemetry
        self.t_imported, self.t_rendezvous = t_imported, t_rendezvous
        self.is_first, self.is_last = env.pp_rank == 0, env.pp_rank == cfg.plan.pp - 1
        self.identity = {"model": cfg.model, "seed": cfg.seed, "global_batch": cfg.global_batch}
        self.last_ckpt: int | None = None
        self.last_save_time = time.time()
        self.move_generation = 0              # the last device-to-device move carried out
        self.fenced = False                   # a newer launch of the job replaced this one (agree, superseded)
        self.reason = ""                      # why the run stopped at a non-finite value (stop_nonfinite)
        (self.run_dir / PIDS_DIR).mkdir(parents=True, exist_ok=True)
        (self.run_dir / PIDS_DIR / f"rank{self.rank}").write_text(f"{os.getpid()} {env.hostname}")

    # --- files rank 0 keeps ------------------------------------------------------------
    def event(self, name: str, **kw) -> None:
        if self.rank == 0:
            self.telemetry.append_jsonl(self.run_dir / EVENTS_FILE, [{"event": name, "time": time.time(), **kw}])

    def progress(self, status: str, done: int, it_s: float | None, **kw) -> None:
        """Rank 0: the job's progress file, while this launch is the job's (``superseded``
        asked again here: a step agreed on before a newer launch fenced this one would
        otherwise write over the newer launch's progress, ahead of the checkpoint it
        resumes from)."""
        if self.rank == 0 and self.cfg.progress_path and not self.superseded():
            self.telemetry.write_progress(self.cfg.progress_path, status=status, iterations_done=done,
                                          steps_total=self.cfg.steps, last_checkpoint_step=self.last_ckpt,
                                          iteration_time_s=it_s, mpiexec_ppid=os.getppid(), **kw)

    def leave(self, status: str, done: int) -> int:
        (self.run_dir / EXITS_DIR).mkdir(exist_ok=True)
        (self.run_dir / EXITS_DIR / f"rank{self.rank}").write_text(f"{status} {done}")
        return NONFINITE_EXIT if status == NONFINITE else 0

    # --- set-up ------------------------------------------------------------------------
    def setup(self) -> None:
        """Model split to this pipeline stage, tensor sharding, data parallelism, Adam."""
        import torch

        from .model import build_model
        from .parallelize import apply_dp, apply_tp
        from .pipeline import split_stage

        cfg, env, plan = self.cfg, self.env, self.plan
        self.model = split_stage(build_model(cfg.model, cfg.seed), env.pp_rank, plan.pp, plan.stage_layers)
        self.model.to(env.device)
        if plan.tp > 1:
            apply_tp(self.model, env.mesh["tp"])
        self.train_module = self.model
        if plan.dp > 1:
            self.train_module = apply_dp(self.model, env.mesh["dp"], use_fsdp=plan.tp > 1 or plan.pp > 1,
                                         device=env.device)
        o = cfg.optimizer
        self.optimizer = torch.optim.Adam(self.train_module.parameters(), lr=o.lr, betas=(o.beta1, o.beta2),
                                          eps=o.eps)
        self.timer = self.telemetry.ComputeTimer(self.model) if cfg.breakdown else None

    def bound_telemetry_log(self) -> None:
        """Rank 0, once per launch: keep the store's measured-runs log bounded (logbound)."""
        if self.rank == 0 and self.cfg.telemetry_store:
            from .logbound import bound_jsonl
            bound_jsonl(Path(self.cfg.telemetry_store) / self.telemetry.MEASURED_RUNS_FILE)

    def build_schedule_and_data(self) -> None:
        from .data import make_source
        from .model import loss_fn
        from .pipeline import build_schedule

        env, plan = self.env, self.plan
        self.schedule = None
        if plan.pp > 1:
            self.schedule = build_schedule(self.train_module, env.pp_rank, plan.pp, env.device,
                                           env.mesh["pp"].get_group(), microbatches=plan.microbatches,
                                           schedule=plan.schedule, loss_fn=loss_fn)
        self.data = make_source(self.model.arch, self.cfg.seed, self.cfg.data_path, self.cfg.data_roots)
        self.device_desc, gpu_type = _device_names(env.device)
        self.gpu_type = self.cfg.gpu_type or gpu_type

    # --- resume and save ---------------------------------------------------------------
    def resume(self) -> int:
        """Load the latest checkpoint (resharding to this plan); the step to start from."""
        from . import checkpoint

        found = checkpoint.latest_checkpoint(self.cfg.checkpoint_dir)
        if found is None:
            return 0
        t0 = time.perf_counter()
        meta = checkpoint.load(found[1], self.train_module, self.optimizer, self.identity)
        duration = time.perf_counter() - t0
        self.last_ckpt = int(meta["step"])
        self.event("load", step=self.last_ckpt, duration_s=duration, path=str(found[1]),
                   saved_plan=meta.get("plan"), bytes=self.state_bytes_read())
        return self.last_ckpt

    def state_bytes_read(self) -> float:
        """Collective: bytes of model + optimizer state all ranks hold (what a load read)."""
        import torch
        import torch.distributed as dist

        local = sum(t.numel() * t.element_size() for v in d2d.held_state(self.train_module, self.optimizer).values()
                    for t in v)
        total = torch.tensor([float(local)], device=self.env.device)
        dist.all_reduce(total)
        return total.item()

    def state_finite(self) -> bool:
        """Collective: whether every rank's weights and optimizer state are all finite."""
        import torch
        import torch.distributed as dist

        held = list(self.train_module.parameters()) + [t for per in self.optimizer.state.values()
                                                        for t in per.values() if torch.is_tensor(t)]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in held]      # (DTensor: this rank's part)
        bad = any(not bool(torch.isfinite(t.detach()).all()) for t in local)
        flag = torch.tensor([float(bad)], device=self.env.device)
        dist.all_reduce(flag)
        return flag.item() == 0

    def save(self, step: int, why: str) -> bool:
        """Save a checkpoint of step ``step`` (collective); False, with nothing saved, when
        some rank's weights or optimizer state are not finite. A launch that a newer one
        replaced while it saved (``superseded``, asked by rank 0 just before the checkpoint
        is committed) saves and records nothing: the new launch resumes from the checkpoint
        that was the latest when it was made the job's (it leaves at its next step)."""
        import torch.distributed as dist

        from . import checkpoint

        if not self.state_finite():
            self.event("save_refused", step=step, why=why, reason="non-finite weights or optimizer state")
            return False
        t0 = time.perf_counter()
        path = checkpoint.save(self.cfg.checkpoint_dir, step, self.train_module, self.optimizer,
                               {**self.identity, "plan": str(self.plan)}, rank=self.rank, barrier=dist.barrier,
                               keep=self.cfg.checkpoint_keep, commit=lambda: not self.superseded())
        if path is None:                    # (rank 0: replaced while saving)
            return True
        duration = time.perf_counter() - t0
        self.event("save", step=step, why=why, duration_s=duration,
                   bytes=sum(f.stat().st_size for f in path.iterdir()) if self.rank == 0 else None)
        self.last_ckpt, self.last_save_time = step, time.time()
        return True

    def stop_nonfinite(self, done: int, what: str) -> None:
        """The reason saying where training stopped and which checkpoint is kept (the progress
        file and the run's last event carry it; ``arena train`` and the service print it)."""
        cfg = self.cfg
        if not cfg.checkpoint_dir:
            kept = "nothing was saved (no checkpoint folder)"
        elif self.last_ckpt is None:
            kept = f"no checkpoint was saved before it in {cfg.checkpoint_dir}"
        else:
            kept = f"the last checkpoint kept is step {self.last_ckpt} in {cfg.checkpoint_dir} (all finite)"
        self.reason = (f"training stopped at step {done}: {what}; nothing was saved after it; {kept}; a rerun "
                       f"from there diverges again unless the learning rate or the data change")

    def save_due(self, done: int) -> bool:
        """Rank 0's periodic rule (steps or seconds since the last save); the result reaches
        every rank through ``agree``."""
        cfg = self.cfg
        if not cfg.checkpoint_dir:
            return False
        by_steps = bool(cfg.checkpoint_every) and done % cfg.checkpoint_every == 0
        by_time = bool(cfg.checkpoint_interval_s) and time.time() - self.last_save_time >= cfg.checkpoint_interval_s
        return by_steps or by_time

    # --- one step ----------------------------------------------------------------------
    def step(self, step: int):
        """Forward, backward and optimizer step; (this rank's loss share, optimizer seconds)."""
        import torch

        from .data import shard_batch
        from .model import loss_fn

        env, plan = self.env, self.plan
        x, y = (t.to(env.device) for t in shard_batch(self.data, step, self.cfg.global_batch, plan.dp, env.dp_rank))
        self.optimizer.zero_grad(set_to_none=True)
        local_loss = torch.zeros((), device=env.device)
        if self.schedule is not None:
            losses: list = []
            if self.is_first:
                self.schedule.step(x)
            elif self.is_last:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
            if self.is_last:
                local_loss = torch.stack([v.detach() for v in losses]).mean()
        else:
            K = plan.microbatches
            for i, (xi, yi) in enumerate(zip(x.chunk(K), y.chunk(K))):
                sync = i == K - 1 or not hasattr(self.train_module, "no_sync")
                with nullcontext() if sync else self.train_module.no_sync():
                    loss = loss_fn(self.train_module(xi), yi) / K
                    loss.backward()
                local_loss += loss.detach()
        t_opt = time.perf_counter()
        self.optimizer.step()
        return local_loss, time.perf_counter() - t_opt

    def agree(self, local_loss, done: int) -> tuple[float, bool, bool, bool, int]:
        """All-reduce the loss (summed over data replicas' last-stage, tensor-rank-0 ranks)
        with the control flags: (loss, stop, save requested, periodic save due, generation
        of a requested device-to-device move or 0)."""
        import torch
        import torch.distributed as dist

        env = self.env
        superseded = False
        if self.rank == 0:
            superseded = self.superseded()
            if (self.run_dir / STOP_FILE).exists():
                _Flags.stop = True
            if (self.run_dir / CHECKPOINT_FILE).exists():
                (self.run_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
                _Flags.save = True
        due = self.rank == 0 and self.save_due(done)
        move = 0
        if self.rank == 0 and (req := d2d.pending_request(self.run_dir, self.move_generation)) is not None:
            move = req.generation
        own = self.is_last and env.tp_rank == 0
        contrib = local_loss / self.plan.dp if own else torch.zeros_like(local_loss)
        ctl = torch.stack([contrib.float(), torch.tensor(float(_Flags.stop), device=env.device),
                           torch.tensor(float(_Flags.save), device=env.device),
                           torch.tensor(float(due), device=env.device), torch.tensor(float(move), device=env.device),
                           torch.tensor(float(superseded), device=env.device)])
        dist.all_reduce(ctl)
        self.fenced = bool(ctl[5] > 0)
        return float(ctl[0]), bool(ctl[1] > 0), bool(ctl[2] > 0), bool(ctl[3] > 0), int(ctl[4])

    def superseded(self) -> bool:
        """Rank 0: whether the job's folder names another run folder as its launch's
        (``CURRENT_FILE``; absent: a launch without an executor, never superseded)."""
        if not self.cfg.progress_path:
            return False
        try:
            current = (Path(self.cfg.progress_path).parent / CURRENT_FILE).read_text().strip()
        except OSError:
            return False
        return bool(current) and current != self.run_dir.name

    def stage_breakdown(self, it_s: float, opt_s: float):
        """--breakdown: per-stage compute (slowest rank of the stage) and the rest as communication."""
        import torch.distributed as dist

        if self.timer is None:
            return None, None
        compute = self.timer.take() + opt_s
        gathered: list = [None] * self.env.world_size
        dist.all_gather_object(gathered, (self.env.pp_rank, compute))
        stage_compute = [max(c for p, c in gathered if p == s) for s in range(self.plan.pp)]
        return stage_compute, [max(0.0, it_s - c) for c in stage_compute]

    def record(self, done: int, loss: float, it_s: float, first: bool, stage_compute, stage_comm) -> None:
        """Rank 0: the step line, results.jsonl and telemetry (the first step is warm-up for the store)."""
        if self.rank != 0:
            return
        cfg, tel = self.cfg, self.telemetry
        print(f"step {done} loss {loss:.6f} time_s {it_s:.4f}", flush=True)
        if not math.isfinite(loss):       # (results and telemetry hold finite steps only)
            return
        tel.append_jsonl(self.run_dir / RESULTS_FILE, [{"step": done, "loss": loss, "iteration_time_s": it_s,
                                                         "time": time.time()}])
        rec = tel.measured_run(cfg, device=self.device_desc, gpu_type=self.gpu_type, iteration_time_s=it_s,
                               step=done, stage_compute_s=stage_compute, stage_comm_s=stage_comm)
        if cfg.telemetry_path:
            tel.append_jsonl(cfg.telemetry_path, [rec])
        if cfg.telemetry_store and not first:
            tel.append_measured_runs(Path(cfg.telemetry_store), [rec])

    # --- device-to-device move (launcher.d2d) --------------------------------------------
    def move(self, generation: int, done: int):
        """Move this job to the requested plan after step ``done``, device to device. Returns
        (the run on the new plan, its start step), None when this rank's position is parked, or "refused"
        (the state is not laid out as the plan says: a checkpoint was saved instead)."""
        import torch
        import torch.distributed as dist

        t_agreed = time.time()
        req = d2d.MoveRequest.read(self.run_dir / d2d.MOVE_FILE)
        if req.generation != generation:
            raise RuntimeError(f"move request changed under the move: {req.generation} != {generation}")
        layout = d2d.model_layout(self.cfg.model)
        old_l = rp.layout(layout, (self.plan.dp, self.plan.tp, self.plan.pp), self.plan.stage_layers)
        held = d2d.held_state(self.train_module, self.optimizer)
        bad = torch.tensor([0.0 if d2d.shapes_match(held, old_l[self.rank]) else 1.0], device=self.env.device)
        dist.all_reduce(bad)
        if bad.item() > 0:
            self.event("move_refused", generation=generation, step=done,
                       reason="held tensors differ from the layout; saving a checkpoint instead")
            if self.cfg.checkpoint_dir and not self.save(done, "move_refused"):
                self.stop_nonfinite(done, "the weights or optimizer state hold non-finite values")
                return NONFINITE
            return "refused"
        box = [held]                # handed over, so that the old state can be freed after the transfer
        del held
        return _carry_out_move(self, req, done, t_agreed, old_l, box)

    # --- the run -----------------------------------------------------------------------
    def stop_requested_at_start(self) -> bool:
        """A stop asked for during start-up (file or SIGTERM on any rank)."""
        import torch
        import torch.distributed as dist

        if self.rank == 0 and (self.run_dir / STOP_FILE).exists():
            _Flags.stop = True
        early = torch.tensor([float(_Flags.stop)], device=self.env.device)
        dist.all_reduce(early)
        return early.item() > 0

    def train(self, start_step: int) -> tuple[str, int]:
        """Steps ``start_step + 1 .. cfg.steps``; (status, steps done)."""
        import torch.distributed as dist

        cfg = self.cfg
        it_s, status, done = None, "finished", start_step
        n_measured, mean_s, measured = 0, 0.0, {}     # steps after this launch's first (warm-up) one
        t_warm = 0.0                    # wall clock when the warm-up step was done (its checkpoint included)
        self.progress("running", start_step, None)
        for step in range(start_step, cfg.steps):
            if self.timer is not None:
                dist.barrier()          # breakdown: every rank's step starts together
                self.timer.take()
            t0 = time.perf_counter()
            local_loss, opt_s = self.step(step)
            done = step + 1
            loss, stop, requested, due, move = self.agree(local_loss, done)
            if self.fenced:                   # another launch trains the job now: nothing of this step is kept
                return "superseded", step
            it_s = time.perf_counter() - t0
            stage_compute, stage_comm = self.stage_breakdown(it_s, opt_s)
            self.record(done, loss, it_s, step == start_step, stage_compute, stage_comm)
            if not math.isfinite(loss):       # every rank has the same all-reduced loss
                self.stop_nonfinite(done, f"the loss is {loss} (not finite)")
                status = NONFINITE
                break
            if cfg.checkpoint_dir and (stop or requested or due) and \
                    not self.save(done, "stop" if stop else "request" if requested else "periodic"):
                self.stop_nonfinite(done, f"the loss is finite ({loss:.6g}) but the weights or optimizer state "
                                          f"hold non-finite values")
                status = NONFINITE
                break
            _Flags.save = False
            if step != start_step:
                n_measured += 1
                mean_s += (it_s - mean_s) / n_measured
                # the wall clock's seconds per step too (checkpoints and --step-delay included): what
                # a rate measured after a move, iterations over wall time, is compared with
                measured = {"measured_iterations": n_measured, "mean_iteration_time_s": mean_s,
                            "wall_iteration_time_s": (time.perf_counter() - t_warm) / n_measured}
            else:
                t_warm = time.perf_counter()
            self.progress("running", done, it_s, **measured)
            if stop:
                status = "stopped"
                break
            if move:
                self.move_generation = move
                status = "moving"
                break
            if cfg.step_delay_s:
                time.sleep(cfg.step_delay_s)
        else:
            if cfg.checkpoint_dir and cfg.checkpoint_at_end and self.last_ckpt != cfg.steps and \
                    not self.save(cfg.steps, "end"):
                self.stop_nonfinite(done, "the weights or optimizer state hold non-finite values")
                status = NONFINITE
        if status == "moving":
            return status, done
        if self.rank == 0:
            (self.run_dir / STOP_FILE).unlink(missing_ok=True)
        extra = {"reason": self.reason} if status == NONFINITE else {}
        self.progress(status, done, it_s, **measured, **extra)
        return status, done


def _carry_out_move(old: "RankRun | None", req: "d2d.MoveRequest", done: int, t_agreed: float, old_l, held_box,
                    *, position: int | None = None, t_imported: float | None = None, device=None,
                    addr: str | None = None):
    """The move's joint part, run by the old job's ranks (``old``) and by joining processes
    (``old`` None, ``position`` given, ``addr`` their host's address or None): joint group,
    transfer, new group, new model. Returns (the new ``RankRun``, the step it continues
    from), None for a parked position, or "relocated" for an old rank of a move to other
    hosts (it leaves)."""
    import socket

    import torch
    import torch.distributed as dist

    from .config import TrainConfig
    from .dist import LOOPBACK, device_for, make_env

    cfg = TrainConfig.from_json(req.config)
    run_dir = Path(cfg.run_dir)
    n_old, n_new = req.old_world, cfg.plan.world_size
    n_joint, offset = req.joint_world(n_new), req.offset
    me = old.rank if old is not None else position          # the joint position
    device = old.env.device if old is not None else device
    addr = (old.env.addr if old is not None else addr) or LOOPBACK
    rv = lambda tag: run_dir / f"rendezvous_{req.generation}_{tag}.json"          # noqa: E731
    t0 = time.time()
    if n_joint > n_old:                         # growing or relocating: a joint group with the new processes
        if old is not None:
            dist.destroy_process_group()
        d2d.join_group(me, n_joint, rv("joint"), cfg, create=me == 0, timeout_s=cfg.comm_timeout_s, addr=addr)
    t_joint = time.time()
    layout = d2d.model_layout(cfg.model)
    new_l = rp.layout(layout, (cfg.plan.dp, cfg.plan.tp, cfg.plan.pp), cfg.plan.stage_layers)
    pieces = rp.transfer_plan(old_l, new_l, kept=0 if req.relocate else min(n_old, n_new))
    held = held_box.pop()
    new_me = me - offset                        # this process's new position (outside 0..n_new-1: none)
    state, sent = d2d.transfer(pieces, me, held, old_l[me] if me < n_old else {},
                               new_l[new_me] if 0 <= new_me < n_new else {}, device, offset=offset)
    # rank 0's RNG, step and last checkpoint (step, time) reach joiners
    rng = [torch.random.get_rng_state(), done, *((old.last_ckpt, old.last_save_time) if old else (None, 0.0))]
    dist.broadcast_object_list(rng, src=0)
    done = rng[1]
    moved = torch.tensor([float(sent)], device=device)
    dist.all_reduce(moved)
    t_moved = time.time()
    if old is not None:                         # the old plan's modules go
        old.model = old.train_module = old.optimizer = old.schedule = None
    del held
    if n_joint > n_new:                         # shrinking or relocating: the new plan's group
        dist.destroy_process_group()
        if req.relocate and new_me < 0:         # an old rank of a move to other hosts: it leaves
            return "relocated"
        if new_me >= n_new:                     # shrinking: the surplus positions park
            d2d.park(run_dir, EXITS_DIR)
            return None
        d2d.join_group(new_me, n_new, rv("new"), cfg, create=new_me == 0, timeout_s=cfg.comm_timeout_s,
                       addr=addr)
    t_group = time.time()
    if old is not None:
        local_rank, host, t_imp = old.env.local_rank, old.env.hostname, old.t_imported
    else:
        local_rank, host, t_imp = _local_rank(new_me), socket.gethostname(), t_imported
    env = make_env(cfg.plan, new_me, n_new, local_rank, device if device is not None else
                   device_for(cfg, local_rank), host, addr)
    run = RankRun(cfg, env, t_imp, time.time())
    run.last_ckpt, run.last_save_time = rng[2], rng[3]
    run.move_generation = req.generation
    run.setup()
    t_built = time.time()
    d2d.install(run.train_module, run.optimizer, state)
    del state
    torch.random.set_rng_state(rng[0])
    run.build_schedule_and_data()
    t_ready = time.time()
    run.event("moved", generation=req.generation, step=done, path="d2d",
              old_plan=list(req.old_plan), new_plan=[cfg.plan.dp, cfg.plan.tp, cfg.plan.pp],
              drain_s=t_agreed - req.requested_at, joint_group_s=t_joint - t0, transfer_s=t_moved - t_joint,
              regroup_s=t_group - t_moved, build_s=t_built - t_group, install_s=t_ready - t_built,
              bytes_moved=moved.item(), pieces=sum(1 for p in pieces if p.src != p.dst + offset),
              world_old=n_old, world_new=n_new, relocated=req.relocate)
    return run, done


def _local_rank(default: int) -> int:
    """This process's index among the job's processes on its host (Hydra's ``MPI_LOCALRANKID``)."""
    try:
        return int(os.environ["MPI_LOCALRANKID"])
    except (KeyError, ValueError):
        return default


def _train_and_move(run: "RankRun", start_step: int) -> tuple["RankRun", str, int]:
    """Train, carrying out device-to-device moves as they are requested; (the run at the
    end, status, steps done). A parked rank returns status "parked"."""
    while True:
        status, done = run.train(start_step)
        if status != "moving":
            return run, status, done
        moved = run.move(run.move_generation, done)
        if moved == NONFINITE:
            run.progress(NONFINITE, done, None, reason=run.reason)
            return run, NONFINITE, done
        if moved == "refused":
            run.progress("stopped", done, None)
            return run, "stopped", done
        if moved is None:
            return run, "parked", done
        if moved == "relocated":
            return run, "relocated", done
        run, start_step = moved


def _import_torch() -> float:
    """Import torch and its distributed packages up front (so the "import" part of start-up
    holds them all), one thread per rank; the time it ended."""
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401

    torch.set_num_threads(1)
    return time.time()


def join(move_path: str, offset: int) -> int:
    """A process started to grow a running job or to take it to other hosts (``--join
    OFFSET``): joint position OFFSET + its MPI rank; marks itself ready, joins the move,
    then trains with the job."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGUSR1, _on_sigusr1)
    from .config import TrainConfig
    from .dist import device_for, host_address

    t_imported = _import_torch()
    req = d2d.MoveRequest.read(move_path)
    cfg = TrainConfig.from_json(req.config)
    addr = host_address(cfg)                    # (before MPI_Init: MPI's interface too)
    from mpi4py import MPI
    position = offset + MPI.COMM_WORLD.Get_rank()
    old_l = rp.layout(d2d.model_layout(cfg.model), req.old_plan, req.old_stage_layers)
    device = device_for(cfg, _local_rank(position - req.offset))
    if os.environ.get(d2d.FAULT_ENV) == f"join:{position}":     # tests: a new process that never gets ready
        raise RuntimeError(f"{d2d.FAULT_ENV}: position {position} fails before it is ready")
    d2d.mark_ready(cfg.run_dir, req.generation, position)
    moved = _carry_out_move(None, req, -1, time.time(), old_l, [{}], position=position, t_imported=t_imported,
                            device=device, addr=addr)
    if moved is None or moved == "relocated":
        return 0
    run, status, done = _train_and_move(*moved)
    if status == "relocated":
        return 0
    return run.leave(status, done)


def main(config_path: str) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGUSR1, _on_sigusr1)
    from .config import TrainConfig
    from .dist import init_distributed

    t_imported = _import_torch()
    cfg = TrainConfig.read(config_path)
    env = init_distributed(cfg)
    run = RankRun(cfg, env, t_imported, time.time())
    run.setup()
    start_step = run.resume()
    if start_step >= cfg.steps:
        run.event("nothing_to_do", step=start_step)
        run.progress("finished", start_step, None)
        return run.leave("finished", start_step)
    run.build_schedule_and_data()
    run.bound_telemetry_log()
    run.event("ready", init_s=time.time() - _T_START, import_s=t_imported - _T_START,
              rendezvous_s=run.t_rendezvous - t_imported, start_step=start_step, plan=str(cfg.plan),
              world_size=env.world_size, device=str(env.device))
    if run.stop_requested_at_start():       # exit before training (nothing new to save)
        run.progress("stopped", start_step, None)
        run.event("stopped", step=start_step)
        return run.leave("stopped", start_step)
    run, status, done = _train_and_move(run, start_step)
    if status == "relocated":                   # the job trains on in the processes it moved to
        return 0
    if status == "parked":
        return run.leave(status, done)
    run.event(status, step=done, **({"reason": run.reason} if status == NONFINITE else {}))
    # No dist.destroy_process_group(): every rank has left its last collective, and
    # os._exit in __main__ closes the sockets (a finished run that still ended non-zero was
    # Hydra SIGKILLing a rank during the exit: see the linger in __main__).
    return run.leave(status, done)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--join":
        entry = lambda: join(sys.argv[1], int(sys.argv[3]))          # noqa: E731
    elif len(sys.argv) == 2:
        entry = lambda: main(sys.argv[1])                             # noqa: E731
    else:
        print("usage: python -m launcher.worker CONFIG.json | MOVE.json --join OFFSET", file=sys.stderr)
        sys.exit(2)
    try:
        code = entry()
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
