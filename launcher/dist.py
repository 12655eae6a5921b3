"""Rank bootstrap: rank and world size from MPI, the torch.distributed rendezvous agreed
over MPI, and the (dp, pp, tp) device mesh.

Rank 0 starts the rendezvous store (a torch ``TCPStore`` on a port the operating system
assigns as it binds, so no other process can take the port between choosing and
binding it) and broadcasts address and port over ``MPI.COMM_WORLD``; every rank then
joins ``init_process_group`` on that store with gloo (CPU) or NCCL (CUDA). Ranks are laid
out with tensor innermost, then pipeline, then data: rank = (d * pp + p) * tp + t, so
a tensor group shares a node whenever the node holds at least ``tp`` ranks.

Addresses. A rank's host is the one the launch named it by (Hydra's ``PMI_HOSTNAME``: the
host file's entry, or the Slurm node; else this host's own name), and its address that
name's in the launch's ``TrainConfig.host_addrs`` (a launch over a host file has them
resolved on the launching host: ``launch.start``). When every rank's host has such an
address (held by one of its interfaces; not loopback), the ranks use it: rank 0's store
is reached there (torch's ``TCPStore`` listens on every interface of rank 0's host), and
gloo, NCCL and MPI bind and connect on the interface that holds it (``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME``, ``UCX_NET_DEVICES``: left alone, gloo and NCCL take the address the
host's own name resolves to, often 127.0.0.1 or 127.0.1.1, and MPICH's UCX every
interface). When none has one and all ranks run on one host (a launch without host list;
``launch.start`` then keeps MPI on the loopback interface), 127.0.0.1. Ranks across hosts
without addresses (Slurm nodes) meet at the address rank 0's host name resolves to.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from . import netaddr

MESH_DIMS = ("dp", "pp", "tp")
HOST_ENV = "PMI_HOSTNAME"               # Hydra: the host as the host file (or Slurm) names it
LOOPBACK = "127.0.0.1"
# the interface gloo, NCCL and MPICH's UCX (MPI itself, which the ranks meet through first) use
IFNAME_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES")


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
    addr: str = LOOPBACK    # the address this rank's process groups use (its host's; see the module doc)


def host_address(cfg) -> str | None:
    """This rank's host address (module doc), None when the launch gives its host none (or
    a loopback one); with one, gloo, NCCL and MPI (``IFNAME_ENVS``: called before MPI_Init)
    are pointed at the interface holding it. An address that no interface here holds is an
    error naming host and interfaces."""
    name = os.environ.get(HOST_ENV) or socket.gethostname()
    addr = dict(cfg.host_addrs).get(name)
    if addr is None or addr.startswith("127."):
        return None
    iface = netaddr.interface_of(addr)
    if iface is None:
        raise RuntimeError(f"host {name!r} ({socket.gethostname()}) has no interface with its address {addr} "
                           f"(interfaces: {netaddr.interface_addresses()})")
    for var in IFNAME_ENVS:
        os.environ[var] = iface
    return addr


def group_address(addrs: list[str | None], names: list[str]) -> str:
    """Rank 0's rendezvous address, for ranks whose host addresses are ``addrs``
    (``host_address``, in rank order) on hosts named ``names`` (their own names): rank 0's
    address when every rank has one; 127.0.0.1 when they share one host; else (ranks
    across hosts without addresses, e.g. on Slurm nodes) the address rank 0's name resolves
    to, which must not be a loopback address."""
    if all(addrs):
        return str(addrs[0])
    if len(set(names)) == 1:
        return LOOPBACK
    addr = socket.gethostbyname(names[0])
    if addr.startswith("127."):
        raise RuntimeError(f"the ranks span hosts {sorted(set(names))[:4]}, but rank 0's host {names[0]!r} "
                           f"resolves to {addr}, which the others cannot reach: give the launch its hosts' "
                           f"addresses (TrainConfig.host_addrs)")
    return addr


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
    mine = host_address(cfg)            # before MPI_Init (the import): MPI's interface too
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    plan = cfg.plan
    if world != plan.world_size:
        raise RuntimeError(f"launched with {world} MPI ranks but plan {plan} needs {plan.world_size}")
    host = socket.gethostname()
    seen = comm.allgather((host, mine))
    names, addrs = [h for h, _ in seen], [a for _, a in seen]
    where = [a or h for h, a in seen]           # a host: by its address where known
    local_rank = where[:rank].count(where[rank])
    store = None
    if rank == 0:
        addr = group_address(addrs, names)
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
    return make_env(plan, rank, world, local_rank, device, host, mine or LOOPBACK)


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


def make_env(plan, rank: int, world: int, local_rank: int, device, host: str, addr: str = LOOPBACK) -> DistEnv:
    """The (dp, pp, tp) mesh over the current default process group and this rank's coordinates."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (plan.dp, plan.pp, plan.tp), mesh_dim_names=MESH_DIMS)
    tp_rank = rank % plan.tp
    pp_rank = (rank // plan.tp) % plan.pp
    dp_rank = rank // (plan.tp * plan.pp)
    return DistEnv(rank, world, local_rank, dp_rank, pp_rank, tp_rank, device, mesh, host, addr)
