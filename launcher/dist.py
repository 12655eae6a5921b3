"""Rank bootstrap: rank and world size from MPI, the torch.distributed rendezvous agreed
over MPI, and the (dp, pp, tp) device mesh.

Rank 0 starts the rendezvous store (a torch ``TCPStore`` on a port the operating system
assigns as it binds, so no other process can take the port between choosing and
binding it; reached at 127.0.0.1 when every rank runs on its host, otherwise at its
host's address) and broadcasts address and port over ``MPI.COMM_WORLD``; every rank
then joins ``init_process_group`` on that store with gloo (CPU) or NCCL (CUDA). Ranks are laid
out with tensor innermost, then pipeline, then data: rank = (d * pp + p) * tp + t, so
a tensor group shares a node whenever the node holds at least ``tp`` ranks.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

MESH_DIMS = ("dp", "pp", "tp")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    device: object          # torch.device
    mesh: object            # torch DeviceMesh with dims MESH_DIMS
    hostname: str


def rendezvous_store(addr: str, port: int | None, world: int, timeout_s: float):
    """The ``TCPStore`` a process group meets on. ``port`` None: the master's, bound to a
    port the operating system picks at bind time (read it from ``.port``); a port probed
    free and bound later can be taken in between — by another launch's rank or by any
    outgoing connection's ephemeral port — and the job then fails with "address already
    in use". Otherwise a client of the master at ``addr:port``."""
    from datetime import timedelta

    import torch.distributed as dist
    t = timedelta(seconds=timeout_s)
    if port is None:
        return dist.TCPStore(addr, 0, world, True, timeout=t, wait_for_workers=False)
    return dist.TCPStore(addr, port, world, False, timeout=t)


def init_distributed(cfg) -> DistEnv:
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    plan = cfg.plan
    if world != plan.world_size:
        raise RuntimeError(f"launched with {world} MPI ranks but plan {plan} needs {plan.world_size}")
    host = socket.gethostname()
    hosts = comm.allgather(host)
    local_rank = hosts[:rank].count(host)
    store = None
    if rank == 0:
        addr = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(host)
        store = rendezvous_store(addr, None, world, cfg.comm_timeout_s)
        rendezvous = (addr, store.port)
    else:
        rendezvous = None
    addr, port = comm.bcast(rendezvous, root=0)
    if store is None:
        store = rendezvous_store(addr, port, world, cfg.comm_timeout_s)

    device = device_for(cfg, local_rank)
    dist.init_process_group(backend_for(cfg), store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.comm_timeout_s))
    return make_env(plan, rank, world, local_rank, device, host)


def use_cuda(cfg) -> bool:
    import torch

    return cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())


def backend_for(cfg) -> str:
    return "nccl" if use_cuda(cfg) else "gloo"


def device_for(cfg, local_rank: int):
    """This rank's device (one GPU per local rank under CUDA), made current."""
    import torch

    if use_cuda(cfg):
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def make_env(plan, rank: int, world: int, local_rank: int, device, host: str) -> DistEnv:
    """The (dp, pp, tp) mesh over the current default process group and this rank's coordinates."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (plan.dp, plan.pp, plan.tp), mesh_dim_names=MESH_DIMS)
    tp_rank = rank % plan.tp
    pp_rank = (rank // plan.tp) % plan.pp
    dp_rank = rank // (plan.tp * plan.pp)
    return DistEnv(rank, world, local_rank, dp_rank, pp_rank, tp_rank, device, mesh, host)
