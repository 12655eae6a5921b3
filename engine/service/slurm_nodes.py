"""The Slurm side of ``arena serve --slurm``: the cluster read from Slurm at start, and
Slurm's node state read again before every round.

At start (``SlurmSetup.discover``): the partition's nodes become the cluster the engine
schedules on (``instances.slurm.discover``; node ids in the spec's order, host names =
Slurm node names), and the launches go to Slurm as batch jobs (``SlurmExecutor``, with
``--partition``, ``--account``, ``--slurm-opt`` and the service's ``--slurm-tag`` in every
job's name and comment).

Before every round (``SlurmNodeState.read``), against that cluster:

- a node Slurm marks down, drained or draining, failing, not responding, powered down
  ... (``SlurmNode.out_of_service``), one Slurm no longer lists in the partition, and one
  whose GPUs changed, is out of service for the round loop: its jobs move off (or stop
  with a checkpoint when there is no room), as after ``arena drain``; a node that comes
  back is offered again;
- a node where Slurm jobs not of this service hold GPUs (CPUs on a CPU node) is out of
  service too, whole: the engine places on whole nodes' GPUs and has no seam for a part
  of a node held by someone else, so the round may not use that node (its jobs move off,
  as after a drain) until those jobs end. What the service's own jobs hold is read from
  Slurm (``squeue``, before and after the node list, so a launch that starts or ends
  between the two reads is not taken for someone else's);
- nodes the partition gained since the start are named in the log and in ``arena
  nodes``: the cluster is fixed at start, a restart takes them in.

When the controller does not answer, the reading says so (``answered`` False): the
service holds its rounds (nothing could be launched, stopped or moved) and the launches
run on; the first round after Slurm answers again catches up. Any other failure to read
(a node Slurm now describes in a way discovery refuses) keeps the last reading and is
logged once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from instances.cluster import ClusterSpec
from instances.errors import InputError
from instances.slurm import CPU_TYPE, SlurmCommands, SlurmView, discover, job_slots, load_gpu_type_table
from launcher.slurm_executor import SlurmExecutorConfig, parse_launch


@dataclass(frozen=True)
class SlurmSettings:
    """``arena serve --slurm``'s options (validated where they are used: the executor's
    config checks the names and options, discovery the partition and the type table)."""
    partition: str | None = None           # --partition (None: Slurm's default partition)
    account: str | None = None             # --account
    options: tuple[str, ...] = ()          # --slurm-opt KEY=VALUE ...
    gpu_types: str | None = None           # --slurm-gpu-types FILE
    tag: str = "arena"                     # --slurm-tag
    conf: str | None = None                # --slurm-conf (None: Slurm's default, or $SLURM_CONF)


@dataclass(frozen=True)
class SlurmSetup:
    """What the service runs on, read from Slurm at start (``discover``)."""
    settings: SlurmSettings
    view: SlurmView                        # the partition's nodes at start
    table: Mapping[str, str]               # the GRES type table
    executor: SlurmExecutorConfig          # launches: nodes, GRES names, partition, account, options, tag

    @classmethod
    def discover(cls, settings: SlurmSettings) -> "SlurmSetup":
        """Read the partition from Slurm; an ``InputError`` naming the option at fault (no
        Slurm commands, the controller down, an unknown partition, a GRES type missing
        from the table ...)."""
        table = load_gpu_type_table(settings.gpu_types)
        commands = SlurmCommands(settings.conf)
        view = discover(commands, settings.partition, table)
        cfg = SlurmExecutorConfig(nodes=view.node_names(), gres=view.launch_gres(), tag=settings.tag,
                                  partition=view.partition, account=settings.account, options=settings.options,
                                  conf=settings.conf)
        return cls(settings, view, table, cfg)

    @property
    def cluster(self) -> ClusterSpec:
        return self.view.spec()


@dataclass(frozen=True)
class SlurmReading:
    """One reading of Slurm's nodes against the cluster read at start."""
    at: float                                       # time.time() of the reading
    answered: bool = True                           # the controller answered (else rounds wait)
    error: str | None = None                        # why this reading failed (the last one stands)
    view: SlurmView | None = None
    out_of_service: dict[int, str] = field(default_factory=dict)   # node id -> why (Slurm, or others' jobs)
    held_by_others: dict[int, int] = field(default_factory=dict)   # node id -> slots Slurm jobs not ours hold
    new_nodes: tuple[str, ...] = ()                 # the partition's nodes the cluster lacks

    def nodes(self, spec: ClusterSpec) -> dict:
        """Per node id, Slurm's side for ``arena nodes``: its state as sinfo prints it, why
        it is out of service for the round loop, slots held by others (JSON-ready)."""
        by_name = {n.name: n for n in self.view.nodes} if self.view is not None else {}
        out = {}
        for n in spec.nodes():
            s = by_name.get(n.host or "")
            out[n.node_id] = {"state": None if s is None else s.sinfo_state,
                              "reason": None if s is None else (s.reason or None),
                              "out_of_service": self.out_of_service.get(n.node_id),
                              "held_by_others": self.held_by_others.get(n.node_id, 0)}
        return out


class SlurmNodeState:
    """Slurm's node state, read before each round against the cluster read at start."""

    def __init__(self, setup: SlurmSetup, log: Callable[[str], None]):
        self.setup, self.log = setup, log
        self.spec = setup.cluster
        self.commands = SlurmCommands(setup.settings.conf)
        self.last = SlurmReading(time.time(), view=setup.view,
                                 **self._against(setup.view, self._own(), self._own()))
        self._logged_error: str | None = None
        self._new_logged: set[str] = set()
        self.down_since: float | None = None        # the controller stopped answering (None: it answers)

    def read(self) -> SlurmReading:
        """Read Slurm's nodes now (``SlurmReading``); kept as ``last`` unless the controller
        did not answer or the read failed, where the last good reading stands."""
        now = time.time()
        try:
            self.commands.ping()
        except InputError as e:
            if self.down_since is None:
                self.down_since = now
                self.log(f"{e.reason}: rounds wait until it answers (launches run on)")
            return SlurmReading(now, answered=False, error=e.reason, view=self.last.view,
                                out_of_service=self.last.out_of_service, held_by_others=self.last.held_by_others,
                                new_nodes=self.last.new_nodes)
        if self.down_since is not None:
            self.log(f"the Slurm controller answers again (after {now - self.down_since:.0f} s)")
            self.down_since = None
        try:
            before = self._own()
            view = discover(self.commands, self.setup.view.partition, self.setup.table)
            after = self._own()
        except InputError as e:
            if e.reason != self._logged_error:
                self._logged_error = e.reason
                self.log(f"Slurm's node list could not be read ({e.reason}); the reading of "
                         f"{time.strftime('%H:%M:%S', time.localtime(self.last.at))} stands")
            return SlurmReading(now, error=e.reason, view=self.last.view, out_of_service=self.last.out_of_service,
                                held_by_others=self.last.held_by_others, new_nodes=self.last.new_nodes)
        self._logged_error = None
        self.last = SlurmReading(now, view=view, **self._against(view, before, after, self.last))
        for name in self.last.new_nodes:
            if name not in self._new_logged:
                self._new_logged.add(name)
                self.log(f"Slurm node {name} is in partition {view.partition!r} but not in the cluster read at "
                         f"start: restart arena serve to schedule on it")
        return self.last

    def peek(self) -> dict:
        """For ``arena nodes`` (the API's thread; nothing of this object changes): Slurm's
        node state read now (each node's ``state`` as sinfo prints it and its reason), with
        the round loop's view of it from the last reading (``out_of_service``,
        ``held_by_others``, ``new_nodes``, ``read_at``). A failed read names why in
        ``error`` and leaves the states out."""
        last, error = self.last, None
        try:
            view = discover(self.commands, self.setup.view.partition, self.setup.table)
        except InputError as e:
            view, error = None, e.reason
        now = SlurmReading(last.at, view=view, out_of_service=last.out_of_service,
                           held_by_others=last.held_by_others)
        nodes = now.nodes(self.spec)
        return {"partition": self.setup.view.partition, "read_at": last.at, "answered": self.down_since is None,
                "error": error, "new_nodes": list(last.new_nodes), "nodes": nodes}

    def _own(self) -> dict[str, int]:
        """Per Slurm node, the slots this service's jobs hold (from ``squeue``)."""
        own: dict[str, int] = {}
        gpu_nodes = {n.name for n in self.setup.view.nodes if n.gpus}
        for js in job_slots(self.commands):
            if parse_launch(js.job, self.setup.settings.tag) is None:
                continue
            for name in js.nodes:
                own[name] = own.get(name, 0) + (js.gpus_per_node if name in gpu_nodes else js.cpus_per_node)
        return own

    def _against(self, view: SlurmView, before: dict[str, int], after: dict[str, int],
                 previous: SlurmReading | None = None) -> dict:
        """``view`` against the cluster at start: out of service (Slurm's state, gone,
        changed, held by jobs not ours), held slots, new nodes. ``before``/``after``: our
        jobs' slots read just before and after ``view`` (the larger counts). A node in
        state UNKNOWN without a drain, down or failing flag (a restarted controller before
        the node's slurmd has registered again) keeps its verdict of ``previous``: a
        controller restart does not take every node out of service (at start, with no
        earlier reading, such a node is out)."""
        own = {n: max(before.get(n, 0), after.get(n, 0)) for n in {*before, *after}}
        a = view.availability(self.spec, own)
        out = dict(a.out_of_service)
        if previous is not None:
            by_name = {n.name: n for n in view.nodes}
            for node in self.spec.nodes():
                s = by_name.get(node.host or "")
                if s is None or not s.registering:
                    continue
                out.pop(node.node_id, None)
                if node.node_id in previous.out_of_service:
                    out[node.node_id] = previous.out_of_service[node.node_id]
        kind = {n.node_id: ("GPUs" if n.gpu_type != CPU_TYPE else "CPUs", n.num_gpus) for n in self.spec.nodes()}
        for node, k in a.unusable_slots.items():
            if node not in out:
                what, total = kind[node]
                out[node] = f"{k} of {total} {what} held by Slurm jobs not arena's"
        return {"out_of_service": out, "held_by_others": dict(a.unusable_slots), "new_nodes": a.new_nodes}
