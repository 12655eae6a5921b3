"""Device-to-device move of a running job's training state (the rank side).

A move changes a running job's plan without going through storage. The ranks of the
running job stop at a step boundary (all agree on it in the per-step all-reduce, like a
checkpoint), then:

1. **Joint world.** Rank positions ``0 .. max(old, new) - 1``: the old job's ranks keep
   their positions; when the job grows, new processes (``python -m launcher.worker
   MOVE.json --join OFFSET``, started by the executor under their own mpiexec when it
   requested the move, so their start-up overlaps the drain) take the positions above.
   Same size or shrinking: the job's process group is the joint world. Growing: every
   process joins a new gloo/NCCL group over a TCP rendezvous rank 0 writes into the run
   directory (``rendezvous_<gen>.json``).
2. **Transfer.** Every process computes the same plan (``reshard_plan.transfer_plan`` on
   the old and new layouts): the pieces whose owner changes are packed per (source,
   destination) pair and sent point-to-point (``isend``/``irecv``); pieces a rank keeps
   are copied in its memory. Each piece carries the parameter slice, Adam's two moments
   and the step count.
3. **New world.** Shrinking: the surplus positions *park* (sleep, holding no state, until
   rank 0 leaves the training loop, then exit with it: ranks leaving an MPICH job early
   were killed by Hydra here) and the others form a new process group.
   Relocating (``MoveRequest.relocate``: the job moves to other hosts): every position
   of the new plan is a new process, started on the new hosts under its own mpiexec
   (positions ``old .. old + new - 1`` of the joint world); the old ranks send all the
   state and leave together (their mpiexec ends), and the new ones form the new group.
   The executor asks for the move only once every new process is up and waiting
   (``ready`` marks in ``join_<gen>/``), so new hosts that cannot start them cost
   nothing: the move then goes through storage. Then every rank
   builds the model on the new plan (mesh, tensor split, FSDP2/DDP, Adam), copies the
   slices it now holds into it, takes rank 0's RNG state, and training continues at the
   next step (data is a function of the step, so the order continues exactly).

Process groups meet at the hosts' addresses (``dist.host_address``: rank 0's for the
rendezvous, each process's interface for gloo or NCCL), 127.0.0.1 on one host without a
host list.

Before anything is sent, every old rank checks that the tensors it holds have the shapes
the layout says; if any rank disagrees the move is refused on every rank and the job
takes the storage path instead (save a checkpoint, stop; the executor relaunches).
A process that dies during the move (``ARENA_FAULT_MOVE=<position>`` kills one, for
tests) takes the job down (gloo raises on its peers): nothing half-moved is trained
on or saved, and the executor relaunches the new plan from the last checkpoint.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from . import reshard_plan as rp

MOVE_FILE = "move.json"            # in the run directory: the current move request
FAULT_ENV = "ARENA_FAULT_MOVE"     # tests: the rank position that SIGKILLs itself mid-transfer ("join:<pos>":
                                   # the joining process at that position exits before it is ready)
PARK_POLL_S = 0.2
RENDEZVOUS_POLL_S = 0.05
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class MoveRequest:
    generation: int
    requested_at: float            # wall time the executor asked for the move
    old_plan: tuple[int, int, int]
    old_stage_layers: tuple[int, ...]
    config: dict                   # the new TrainConfig (JSON)
    relocate: bool = False         # every new position is a new process (on other hosts); the old ranks leave

    @classmethod
    def read(cls, path) -> "MoveRequest":
        d = json.loads(Path(path).read_text())
        return cls(int(d["generation"]), float(d["requested_at"]), tuple(d["old_plan"]),
                   tuple(d.get("old_stage_layers", ())), d["config"], bool(d.get("relocate", False)))

    def write(self, path) -> None:
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps({"generation": self.generation, "requested_at": self.requested_at,
                                   "old_plan": list(self.old_plan),
                                   "old_stage_layers": list(self.old_stage_layers), "config": self.config,
                                   "relocate": self.relocate}))
        os.replace(tmp, path)

    @property
    def old_world(self) -> int:
        return self.old_plan[0] * self.old_plan[1] * self.old_plan[2]

    def joint_world(self, new_world: int) -> int:
        """Positions of the joint world: old and new side by side when relocating, else the larger."""
        return self.old_world + new_world if self.relocate else max(self.old_world, new_world)

    @property
    def offset(self) -> int:
        """The joint position of new position 0."""
        return self.old_world if self.relocate else 0


def ready_dir(run_dir, generation: int) -> Path:
    """Where joining processes mark that they are up and waiting for the move (``ready<pos>``)."""
    return Path(run_dir) / f"join_{generation}"


def mark_ready(run_dir, generation: int, position: int) -> None:
    d = ready_dir(run_dir, generation)
    d.mkdir(exist_ok=True)
    (d / f"ready{position}").write_text(f"{os.getpid()}\n")


def ready_count(run_dir, generation: int) -> int:
    d = ready_dir(run_dir, generation)
    return sum(1 for _ in d.glob("ready*")) if d.is_dir() else 0


def pending_request(run_dir, after_generation: int) -> MoveRequest | None:
    """The move request in ``run_dir`` if newer than ``after_generation``."""
    p = Path(run_dir) / MOVE_FILE
    try:
        req = MoveRequest.read(p)
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
    return req if req.generation > after_generation else None


def model_layout(model_name: str):
    """``reshard_plan.ModelLayout`` of a catalog model (built on the meta device: shapes only)."""
    import torch

    from .model import build_model
    from .parallelize import tp_plan

    with torch.device("meta"):
        m = build_model(model_name, 0)
    styles = tp_plan(m.arch) if m.arch.is_transformer else {}
    return rp.ModelLayout({n: tuple(p.shape) for n, p in m.named_parameters()}, len(m.layers),
                          tuple(m.FIRST_STAGE), tuple(m.LAST_STAGE), styles)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def held_state(train_module, optimizer) -> dict[str, tuple]:
    """Name -> (param, exp_avg, exp_avg_sq, step) local tensors of this rank."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(train_module, optimizer)
    out = {}
    for name, p in msd.items():
        st = osd["state"][name]
        out[name] = (_local(p).detach(), _local(st["exp_avg"]).detach(), _local(st["exp_avg_sq"]).detach(),
                     _local(st["step"]).detach())
    return out


def shapes_match(held: dict[str, tuple], regions: dict[str, rp.Region]) -> bool:
    if set(held) != set(regions):
        return False
    return all(tuple(held[n][0].shape) == tuple(k for _, k in regions[n]) for n in held)


def _slices(region: rp.Region, base: rp.Region) -> tuple:
    return tuple(slice(lo - b0, lo - b0 + n) for (lo, n), (b0, _) in zip(region, base))


def transfer(pieces: list[rp.Piece], me: int, held: dict[str, tuple], old_regions: dict[str, rp.Region],
             new_regions: dict[str, rp.Region], device, offset: int = 0) -> tuple[dict[str, list], int]:
    """Carry out this rank's part of ``pieces`` over the default process group (this
    process is joint position ``me``; a piece's source is an old position, its destination
    a new one, at joint position ``dst + offset``): send what it owes, receive what it
    needs. Returns (name -> [param, exp_avg, exp_avg_sq, step] of the new regions, bytes
    this rank sent)."""
    import torch
    import torch.distributed as dist

    out: dict[str, list] = {}
    for name, reg in new_regions.items():
        shape = tuple(n for _, n in reg)
        out[name] = [torch.empty(shape, dtype=torch.float32, device=device) for _ in range(3)] + [None]

    def pack(p: rp.Piece):
        src = held[p.name]
        sl = _slices(p.region, old_regions[p.name])
        return [t[sl].reshape(-1) for t in src[:3]] + [src[3].reshape(1).float()]

    def unpack(p: rp.Piece, parts) -> None:
        dst = out[p.name]
        sl = _slices(p.region, new_regions[p.name])
        shape = tuple(n for _, n in p.region)
        for i in range(3):
            dst[i][sl] = parts[i].reshape(shape)
        if dst[3] is None:
            dst[3] = parts[3].reshape(())

    sends: dict[int, list] = {}
    recvs: dict[int, list[rp.Piece]] = {}
    for p in pieces:
        dst = p.dst + offset
        if p.src == me and dst == me:
            unpack(p, pack(p))
        elif p.src == me:
            sends.setdefault(dst, []).extend(pack(p))
        elif dst == me:
            recvs.setdefault(p.src, []).append(p)
    ops, bufs, sent = [], {}, 0
    for src, ps in sorted(recvs.items()):
        bufs[src] = torch.empty(sum(p.numel * rp.STATE_COPIES + 1 for p in ps), dtype=torch.float32,
                                device=device)
        ops.append(dist.irecv(bufs[src], src))
    for dst, parts in sorted(sends.items()):
        buf = torch.cat(parts).contiguous()
        sent += buf.numel() * buf.element_size()
        ops.append(dist.isend(buf, dst))
    if os.environ.get(FAULT_ENV) == str(me):        # tests: die with the transfer half done
        os.kill(os.getpid(), signal.SIGKILL)
    for op in ops:
        op.wait()
    for src, ps in recvs.items():
        off = 0
        for p in ps:
            n = p.numel
            parts = [bufs[src][off + i * n: off + (i + 1) * n] for i in range(3)] + [bufs[src][off + 3 * n:
                                                                                            off + 3 * n + 1]]
            unpack(p, parts)
            off += 3 * n + 1
    missing = [n for n, v in out.items() if v[3] is None]
    if missing:
        raise RuntimeError(f"d2d move: no piece of {missing[:3]} reached rank {me}")
    return out, sent


def install(train_module, optimizer, state: dict[str, list]) -> None:
    """Copy the moved state into a freshly built model and optimizer (the load path of
    ``checkpoint.load``, with the tensors coming from peers)."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(train_module, optimizer)
    if set(msd) != set(state):
        raise RuntimeError(f"d2d move: rank holds {sorted(set(msd) ^ set(state))[:3]} unlike the layout")
    with torch.no_grad():
        for name, (p, m1, m2, step) in state.items():
            st = osd["state"][name]
            for dst, src in ((msd[name], p), (st["exp_avg"], m1), (st["exp_avg_sq"], m2)):
                loc = _local(dst)
                if tuple(loc.shape) != tuple(src.shape):
                    raise RuntimeError(f"d2d move: {name} is {tuple(loc.shape)} here, layout says "
                                       f"{tuple(src.shape)}")
                loc.copy_(src)
            _local(st["step"]).copy_(step.to(_local(st["step"]).dtype))
    set_state_dict(train_module, optimizer, model_state_dict=msd,
                   optim_state_dict={"state": osd["state"], "param_groups": osd["param_groups"]})


def join_group(rank: int, world: int, rendezvous_path: Path, cfg, *, create: bool, timeout_s: float,
               addr: str = LOOPBACK) -> None:
    """(Re)initialise the default process group: position ``rank`` of ``world``. Rank 0
    (``create``) starts the rendezvous store (``dist.rendezvous_store``: a port bound as
    it is chosen) at ``addr``, its host's address (``dist.host_address``), and writes it
    to ``rendezvous_path``; the others wait for it."""
    from datetime import timedelta

    import torch.distributed as dist

    from .dist import backend_for, rendezvous_store

    store = None
    if create:
        store = rendezvous_store(addr, None, world, cfg.comm_timeout_s)
        tmp = Path(str(rendezvous_path) + ".tmp")
        tmp.write_text(json.dumps({"addr": addr, "port": store.port}))
        os.replace(tmp, rendezvous_path)
    deadline = time.monotonic() + timeout_s
    while not Path(rendezvous_path).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"d2d move: no rendezvous {rendezvous_path} after {timeout_s} s")
        time.sleep(RENDEZVOUS_POLL_S)
    if store is None:
        rv = json.loads(Path(rendezvous_path).read_text())
        store = rendezvous_store(rv["addr"], rv["port"], world, cfg.comm_timeout_s)
    dist.init_process_group(backend_for(cfg), store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.comm_timeout_s))


def park(run_dir: Path, exits_dir: str) -> None:
    """A position the new plan does not use: wait (no state, no collectives) until rank 0
    leaves the training loop, so the MPI job ends together."""
    while not (run_dir / exits_dir / "rank0").exists():
        time.sleep(PARK_POLL_S)
