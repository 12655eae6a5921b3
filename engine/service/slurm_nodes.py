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
- nodes the partition gained since the start (``new_nodes``) are named in ``arena
  nodes``. With ``--slurm-new-nodes restart`` (the default) the service takes them in by
  restarting itself in place once ``restart_for`` names them (``new_nodes_restart``: the
  same usable new nodes in two readings in a row, every node of the cluster still in the
  partition, and no in-place restart within ``RESTART_GAP_S``): daemon.py leaves its run
  loop as a crash would (no job stopped), and ``arena serve`` executes itself again; the
  restarted service re-adopts the running Slurm jobs. The cluster's node order is kept in
  the work folder (``NODE_RECORD``), so that the known nodes keep their node ids and the
  new ones come after them. With ``ignore`` they are only logged: a restart takes them in.

When the controller does not answer, the reading says so (``answered`` False): the
service holds its rounds (nothing could be launched, stopped or moved) and the launches
run on; the first round after Slurm answers again catches up. Any other failure to read
(a node Slurm now describes in a way discovery refuses) keeps the last reading and is
logged once.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from instances.cluster import ClusterSpec
from instances.errors import InputError
from instances.slurm import (
    CPU_TYPE,
    SlurmCommands,
    SlurmView,
    discover,
    job_slots,
    list_jobs,
    load_gpu_type_table,
)
from launcher.slurm_executor import SlurmExecutorConfig, parse_launch

from .config import NEW_NODE_ACTIONS, RESTART_GAP_S

NODE_RECORD = ".slurm-nodes.json"             # in the work folder: the cluster's Slurm node names in node-id
                                              # order, and when the service last restarted for new nodes


def read_node_record(work_dir: str | os.PathLike) -> tuple[tuple[str, ...], float | None]:
    """The node names of the cluster the last service on this work folder ran on, in
    node-id order, and the time of its last in-place restart (None: none); ``((), None)``
    when there is no record or it cannot be read (discovery then numbers the nodes afresh)."""
    try:
        rec = json.loads((Path(work_dir) / NODE_RECORD).read_text())
        nodes = tuple(rec["nodes"])
        at = rec.get("restarted_at")
        if not all(isinstance(n, str) for n in nodes) or not (at is None or isinstance(at, (int, float))):
            return (), None
        return nodes, None if at is None else float(at)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return (), None


def write_node_record(work_dir: str | os.PathLike, nodes: tuple[str, ...], restarted_at: float | None) -> None:
    """Write the record ``read_node_record`` reads (atomically: a temporary file renamed)."""
    path = Path(work_dir) / NODE_RECORD
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"nodes": list(nodes), "restarted_at": restarted_at}))
    os.replace(tmp, path)


def new_nodes_restart(before: tuple[str, ...], now_usable: tuple[str, ...], all_known_present: bool,
                      last_restart_at: float | None, now: float, gap_s: float = RESTART_GAP_S) -> tuple[str, ...]:
    """The new nodes to restart in place for now (empty: no restart). ``before`` and
    ``now_usable``: the usable new nodes (in the partition, not in the cluster, in service
    by Slurm's state and held by no one else's jobs) of the last reading and of this one.
    Only the nodes in both count (a node that flaps in and out does not restart the
    service every round); none while a node of the cluster is missing from the partition
    (the node ids of the known nodes would change) or within ``gap_s`` of the last
    in-place restart."""
    names = tuple(n for n in now_usable if n in before)
    if not names or not all_known_present:
        return ()
    if last_restart_at is not None and now - last_restart_at < gap_s:
        return ()
    return names


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
    new_nodes: str = "restart"             # --slurm-new-nodes: restart in place to take them in, or ignore

    def __post_init__(self):
        if self.new_nodes not in NEW_NODE_ACTIONS:
            raise InputError(f"must be one of {', '.join(NEW_NODE_ACTIONS)}, got {self.new_nodes!r}",
                             field="new_nodes")


@dataclass(frozen=True)
class SlurmSetup:
    """What the service runs on, read from Slurm at start (``discover``)."""
    settings: SlurmSettings
    view: SlurmView                        # the partition's nodes at start
    table: Mapping[str, str]               # the GRES type table
    executor: SlurmExecutorConfig          # launches: nodes, GRES names, partition, account, options, tag

    @classmethod
    def discover(cls, settings: SlurmSettings, order: tuple[str, ...] = ()) -> "SlurmSetup":
        """Read the partition from Slurm; an ``InputError`` naming the option at fault (no
        Slurm commands, the controller down, an unknown partition, a GRES type missing
        from the table ...). ``order``: the node names of the cluster the last service ran
        on (``read_node_record``): they keep their node ids."""
        table = load_gpu_type_table(settings.gpu_types)
        commands = SlurmCommands(settings.conf)
        view = discover(commands, settings.partition, table, order=order)
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
    usable_new: tuple[str, ...] = ()                # those of them Slurm has in service, held by no one else

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


def reading_against(spec: ClusterSpec, view: SlurmView, before: dict[str, int], after: dict[str, int],
                    previous: SlurmReading | None = None) -> dict:
    """``view`` (Slurm's nodes read now) against ``spec`` (the cluster read at start): the
    fields of a ``SlurmReading`` after its time and view (out of service: Slurm's state,
    gone, changed, held by jobs not ours; held slots; new nodes, and those of them usable).
    ``before``/``after``: per Slurm node, our jobs' slots read just before and after
    ``view`` (the larger counts). A node in state UNKNOWN without a drain, down or failing
    flag (a restarted controller before the node's slurmd has registered again) keeps its
    verdict of ``previous``: a controller restart does not take every node out of service
    (at start, with no earlier reading, such a node is out)."""
    own = {n: max(before.get(n, 0), after.get(n, 0)) for n in {*before, *after}}
    a = view.availability(spec, own)
    out = dict(a.out_of_service)
    if previous is not None:
        by_name = {n.name: n for n in view.nodes}
        for node in spec.nodes():
            s = by_name.get(node.host or "")
            if s is None or not s.registering:
                continue
            out.pop(node.node_id, None)
            if node.node_id in previous.out_of_service:
                out[node.node_id] = previous.out_of_service[node.node_id]
    kind = {n.node_id: ("GPUs" if n.gpu_type != CPU_TYPE else "CPUs", n.num_gpus) for n in spec.nodes()}
    for node, k in a.unusable_slots.items():
        if node not in out:
            what, total = kind[node]
            out[node] = f"{k} of {total} {what} held by Slurm jobs not arena's"
    held = view.unusable_slots(own)
    usable = tuple(n for n in a.new_nodes if view.node(n).out_of_service is None and n not in held)
    return {"out_of_service": out, "held_by_others": dict(a.unusable_slots), "new_nodes": a.new_nodes,
            "usable_new": usable}


class SlurmNodeState:
    """Slurm's node state, read before each round against the cluster read at start."""

    def __init__(self, setup: SlurmSetup, log: Callable[[str], None], last_restart_at: float | None = None):
        """``last_restart_at``: when a service on this work folder last restarted in place
        for new nodes (``read_node_record``; None: never)."""
        self.setup, self.log = setup, log
        self.spec = setup.cluster
        self.commands = SlurmCommands(setup.settings.conf)
        self.last = SlurmReading(time.time(), view=setup.view,
                                 **reading_against(self.spec, setup.view, self._own(), self._own()))
        self._logged_error: str | None = None
        self._new_logged: set[str] = set()
        self.down_since: float | None = None        # the controller stopped answering (None: it answers)
        self.last_restart_at = last_restart_at
        self.restart_for: tuple[str, ...] = ()      # new nodes to restart in place for (new_nodes_restart)

    def read(self) -> SlurmReading:
        """Read Slurm's nodes now (``SlurmReading``); kept as ``last`` unless the controller
        did not answer or the read failed, where the last good reading stands."""
        now = time.time()
        self.restart_for = ()
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
        previous = self.last
        self.last = SlurmReading(now, view=view, **reading_against(self.spec, view, before, after, self.last))
        restart = self.setup.settings.new_nodes == "restart"
        if restart:
            present = {n.name for n in view.nodes} >= {n.host for n in self.spec.nodes()}
            self.restart_for = new_nodes_restart(previous.usable_new, self.last.usable_new, present,
                                                 self.last_restart_at, now)
        for name in self.last.new_nodes:
            if name not in self._new_logged:
                self._new_logged.add(name)
                self.log(f"Slurm node {name} is in partition {view.partition!r} but not in the cluster read at "
                         + ("start: taken in by a restart in place once it is in service in two readings in a row "
                            f"(at most one such restart per {RESTART_GAP_S:g} s)" if restart else
                            "start (--slurm-new-nodes ignore): restart arena serve to schedule on it"))
        return self.last

    def describe(self, names: tuple[str, ...]) -> str:
        """``n5 (a100 x1), n6 (cpu x4)``: new nodes as the last reading has them."""
        view = self.last.view
        by_name = {n.name: n for n in view.nodes} if view is not None else {}
        return ", ".join(f"{n} ({by_name[n].gpu_type} x{by_name[n].slots})" if n in by_name else n for n in names)

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

    def jobs(self, ids) -> dict[int, dict]:
        """For the API (its thread): Slurm's state of these batch jobs now, by Slurm job id
        (``{"state": "PENDING", "reason": "Resources"}``, as ``squeue`` prints them); ``{}``
        when Slurm cannot be asked (the views then show the database's status alone). The
        controller is pinged first: ``squeue`` against one that is down retries for about
        ``MessageTimeout`` seconds, which would hold every page poll as long."""
        try:
            self.commands.ping()
            found = list_jobs(self.commands, ids)
        except InputError:
            return {}
        return {i: {"state": j.state, "reason": j.reason} for i, j in found.items()}

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
