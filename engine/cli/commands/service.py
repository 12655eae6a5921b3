"""`arena serve` and its clients: live rescheduling rounds over real torch jobs.

``arena serve`` runs the scheduler (the same round loop, policies, objectives and
estimators as the simulator, on the wall clock, with the MPI launcher) and serves a JSON
HTTP API and a status page (http://127.0.0.1:8765/ by default). State is in SQLite
(``--db``), crash-safe: a restarted service takes over its jobs. ``SIGTERM`` or Ctrl-C
stops every running job with a checkpoint.

``arena submit JOB.toml`` (or flags), ``arena status [ID] [--watch]``, ``arena cancel ID``,
``arena hold ID`` / ``arena release ID``, ``arena priority ID P``, ``arena drain NODE`` / ``arena undrain NODE``,
``arena nodes``, ``arena rounds`` (with ``--shadow-policy P``: where P would have decided
otherwise), ``arena logs ID`` and ``arena jobs --json`` talk to it over HTTP (``--url``,
``--token``; environment ``ARENA_URL``, ``ARENA_TOKEN``).
"""
from __future__ import annotations

import argparse
import errno
import ipaddress
import math
import os
import socket
import stat
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.service.client import DEFAULT_URL, Client, NoAnswer
from engine.service.config import ServiceConfig
from engine.service.lock import DB_LOCK_SUFFIX, ServiceLock
from instances.errors import InputError
from instances.limits import check_priority, check_time

from ..flags import add_config_flags, config_flags, config_not_flags, config_values, fields_as_flags
from ..jsonout import dumps

# The flag that sets each field of ServiceConfig, from the field's metadata (engine/service/config.py),
# for its errors; tests/test_cli_flags.py walks it against the config's fields and the parser.
SERVE_FLAGS = config_flags(ServiceConfig)
SERVE_NOT_FLAGS = config_not_flags(ServiceConfig)    # (the defaults hold)
# the flags listed after --host, --port, --token and --tokens-file in `arena serve --help`
SERVE_LAST = ("stop_after_s", "step_delay_s")
# the flag that sets each field of SlurmSettings (engine/service/slurm_nodes.py) it validates itself
SLURM_FLAGS = {"new_nodes": "--slurm-new-nodes"}

LOOPBACK_NAMES = ("localhost",)
# the host names a loopback service answers to without a token, beside its --host
# (engine/service/api.py, ``_foreign``: a guard against DNS rebinding)
LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", *LOOPBACK_NAMES})


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("ARENA_URL", DEFAULT_URL),
                   help=f"the service's address (default $ARENA_URL or {DEFAULT_URL})")
    p.add_argument("--token", default=os.environ.get("ARENA_TOKEN"),
                   help="API token, when the service was started with one (default $ARENA_TOKEN)")


def register(subparsers) -> None:
    _register_serve(subparsers)
    _register_clients(subparsers)


def _register_serve(subparsers) -> None:
    """``arena serve``: its own flags, then those of ServiceConfig (from the config's fields)."""
    doc = __doc__.split("\n\n")
    s = subparsers.add_parser("serve", help="run the live rescheduling service (API, status page, SQLite state)",
                              description="\n\n".join(doc[:2]), formatter_class=argparse.RawDescriptionHelpFormatter)
    where = s.add_argument_group("cluster (one of)")
    where.add_argument("--cluster", metavar="FILE",
                       help="cluster JSON (as for simulate) with \"hosts\": one host name per node in each group")
    where.add_argument("--local-slots", type=int, metavar="N",
                       help="one host (this one) whose CPU ranks stand in for N GPUs (type cpu)")
    where.add_argument("--slurm", action="store_true",
                       help="the nodes of a Slurm partition (read from Slurm at start, their state again every "
                            "round); launches run as Slurm batch jobs (docs/slurm.md)")
    s.add_argument("--local-nodes", type=int, default=1, metavar="K",
                   help="with --local-slots: K nodes of N slots each, all on this host (to try multi-node "
                        "placement, moves and drains on one machine; default 1)")
    sl = s.add_argument_group("Slurm (with --slurm)")
    sl.add_argument("--partition", default=None, metavar="P", help="the Slurm partition (default: Slurm's default one)")
    sl.add_argument("--account", default=None, metavar="A", help="the Slurm account every launch is charged to")
    sl.add_argument("--slurm-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra sbatch option for every launch, without its dashes (repeatable), e.g. "
                         "time=2-00:00:00, reservation=arena, qos=high; not the ones the service sets itself "
                         "(nodes, tasks, GRES, names, logs, partition, account)")
    sl.add_argument("--slurm-gpu-types", default=None, metavar="FILE",
                    help="a JSON object mapping Slurm GRES types to catalog GPU types, over the built-in table "
                         "(instances/data/slurm/gpu_types.json), e.g. {\"a100\": \"a100-80gb\"}")
    sl.add_argument("--slurm-tag", default="arena", metavar="TAG",
                    help="this service's mark in its Slurm jobs' names and comments, by which a restarted "
                         "service finds the jobs it left running; give every service on one Slurm cluster its own "
                         "(default %(default)s)")
    sl.add_argument("--slurm-conf", default=None, metavar="FILE",
                    help="the cluster's slurm.conf (default: Slurm's own, or $SLURM_CONF)")
    from engine.service.config import NEW_NODE_ACTIONS, RESTART_GAP_S
    sl.add_argument("--slurm-new-nodes", choices=NEW_NODE_ACTIONS, default="restart",
                    help="nodes the partition gains while the service runs: restart = the service restarts "
                         "itself in place to take them in (no job stopped: the running Slurm jobs are "
                         "re-adopted) once such a node is in service in two readings in a row, at most once "
                         f"per {RESTART_GAP_S:g} s; ignore = only log them (a restart takes them in) "
                         "(default %(default)s)")
    s.add_argument("--policy", default="arena", metavar="NAME", help="scheduling policy (default arena)")
    s.add_argument("--policy-opt", action="append", default=[], metavar="KEY=VALUE", help="policy option (repeatable)")
    s.add_argument("--perf", default=None, metavar="KIND",
                   help="performance model the policy decides with: analytic, learned, learned-level, table, online "
                        "(default: analytic, which ranks grids best; "
                        "fcfs needs none)")
    from ..common import add_profile_store_arg, add_shadow_args
    add_profile_store_arg(s)
    add_shadow_args(s)
    s.add_argument("--reconfig-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="reconfiguration cost option (repeatable), e.g. restart_s=10")
    add_config_flags(s, ServiceConfig, skip=SERVE_LAST)   # --db ... --failure-window (engine/service/config.py)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any other needs --token or --tokens-file)")
    s.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    from engine.service.auth import MAKE_TOKEN, MIN_TOKEN_CHARS
    s.add_argument("--token", default=None,
                   help="API token, one user who may do everything (default $ARENA_TOKEN unless --tokens-file is "
                        f"given); at least {MIN_TOKEN_CHARS} characters of two kinds or more; make one with: "
                        + MAKE_TOKEN.replace("%", "%%"))
    s.add_argument("--tokens-file", default=None, metavar="FILE",
                   help="a token per user: lines 'USER TOKEN' or 'USER TOKEN admin' (mode 600). A job's cancel, "
                        "hold, release and priority need its submitter's token or an admin's; a drain an admin's; "
                        "every user may read and submit (docs/service.md, \"Who may do what\")")
    add_config_flags(s, ServiceConfig, only=SERVE_LAST)
    s.set_defaults(func=run_serve)


def _register_clients(subparsers) -> None:
    """The service's clients (over HTTP) and the commands that read its database."""
    sub = subparsers.add_parser("submit", help="submit a job to the service (JOB.toml or flags)",
                                description="Submit a job: a TOML job file (see docs/service.md) or flags. The "
                                            "service validates it and answers with its id.")
    sub.add_argument("file", nargs="?", metavar="JOB.toml", help="job file")
    sub.add_argument("--name", help="job name (letters, digits, . _ -)")
    sub.add_argument("--model", help="catalog model or a Hugging Face-style config.json")
    sub.add_argument("--batch", type=int, dest="global_batch", help="global batch (samples per step)")
    sub.add_argument("--steps", type=int, help="training steps")
    sub.add_argument("--gpus", type=int, help="GPU count asked for (optional)")
    sub.add_argument("--gpu-type", help="GPU type asked for (optional)")
    sub.add_argument("--after", type=int, action="append", metavar="ID",
                     help="start only once job ID of this service has finished (repeatable; optional); if it "
                          "fails or is cancelled, this job fails")
    sub.add_argument("--key", metavar="KEY",
                     help="idempotency key: submitting again with the same key gives back the job it submitted, "
                          "not a second one (default: a new random key, printed when no answer came)")
    sub.add_argument("--json", action="store_true", help="print the answer as JSON")
    _client_args(sub)
    sub.set_defaults(func=run_submit)

    st = subparsers.add_parser("status", help="the service's jobs, or one job, as the database has them",
                               description="Jobs with status, plan, progress and loss (one job: its history).")
    st.add_argument("id", nargs="?", type=int, help="job id")
    st.add_argument("--watch", action="store_true", help="refresh every 2 s until every job has ended (Ctrl-C stops)")
    st.add_argument("--patience", type=float, default=120.0, metavar="S",
                    help="with --watch: wait this long for a service that stopped answering (restarting) before "
                         "giving up (default 120)")
    st.add_argument("--json", action="store_true", help="print JSON")
    _client_args(st)
    st.set_defaults(func=run_status)

    c = subparsers.add_parser("cancel", help="cancel a job (stopped with a checkpoint)",
                              description="Ask the service to cancel a job; a running one is stopped with a "
                                          "checkpoint.")
    c.add_argument("id", type=int, help="job id")
    _client_args(c)
    c.set_defaults(func=run_cancel)

    h = subparsers.add_parser("hold", help="set a job aside (stopped with a checkpoint) until released",
                              description="Ask the service to set a job aside: a running one is stopped with a "
                                          "checkpoint, a queued one leaves the queue; it keeps its progress and is "
                                          "not scheduled until `arena release ID` (e.g. to let an urgent job through "
                                          "or to inspect a run). A held job stays held across service restarts.")
    h.add_argument("id", type=int, help="job id")
    h.add_argument("--reason", default="", help="why (in the job's history and the log)")
    _client_args(h)
    h.set_defaults(func=run_hold)

    rl = subparsers.add_parser("release", help="return a held job to the queue",
                               description="Return a held job to the queue; it resumes from the checkpoint it was "
                                           "held at when the policy next places it. A hold not yet carried out is "
                                           "withdrawn.")
    rl.add_argument("id", type=int, help="job id")
    _client_args(rl)
    rl.set_defaults(func=run_release)

    pr = subparsers.add_parser("priority", help="change a job's priority",
                               description="Set a queued, running or held job's priority (in [1e-4, 1e4]; "
                                           "submitted jobs have 1 unless their spec says otherwise). The next round "
                                           "decides with it: the policies whose objective has the throughput term, "
                                           "which weighs a job by its priority (arena, arena-incremental, suika, sia, "
                                           "sia-ap), favour it; fcfs, gavel and elasticflow-ls ignore priorities. The "
                                           "job's history notes the change.")
    pr.add_argument("id", type=int, help="job id")
    pr.add_argument("priority", type=float, help="the new priority (in [1e-4, 1e4])")
    pr.add_argument("--reason", default="", help="why (in the job's history)")
    _client_args(pr)
    pr.set_defaults(func=run_priority)

    d = subparsers.add_parser("drain", help="take a node out of service (its jobs move off)",
                              description="Take a node out of service for maintenance or repair: the next round "
                                          "moves the jobs on it elsewhere (or, with no room, stops them with a "
                                          "checkpoint and queues them), and nothing is placed there until "
                                          "`arena undrain`.")
    d.add_argument("node", help="node id (as `arena nodes` and the page show it) or host name")
    d.add_argument("--reason", default="", help="why (shown on the page and in the log)")
    _client_args(d)
    d.set_defaults(func=run_drain, drain=True)

    u = subparsers.add_parser("undrain", help="return a drained node to service",
                              description="Return a drained node to service; the next round may place jobs on it.")
    u.add_argument("node", help="node id or host name")
    _client_args(u)
    u.set_defaults(func=run_drain, drain=False)

    nd = subparsers.add_parser("nodes", help="the cluster's nodes: GPUs held, drained ones with why",
                               description="Every node of the service's cluster: GPU type, GPUs held by jobs, "
                                           "and whether it is drained (with the reason).")
    nd.add_argument("--json", action="store_true", help="print JSON")
    _client_args(nd)
    nd.set_defaults(func=run_nodes)

    lg = subparsers.add_parser("logs", help="a job's latest launch output",
                               description="The stdout and stderr of a job's latest launch.")
    lg.add_argument("id", type=int, help="job id")
    lg.add_argument("--chars", type=int, default=20_000,
                    help="characters from the end of each (0-1000000, default 20000)")
    _client_args(lg)
    lg.set_defaults(func=run_logs)

    r = subparsers.add_parser("rounds", help="the service's last scheduling rounds (and the shadow policy's view)",
                              description="The last rounds as the database has them: trigger, decision time, the "
                                          "grids decided; with `arena serve --shadow-policy P`, where P would have "
                                          "decided otherwise, and its agreement over every round.")
    r.add_argument("--last", type=int, default=10, metavar="N", help="rounds to show (1-1000, default 10)")
    r.add_argument("--json", action="store_true", help="print JSON (the rounds and the shadow counts)")
    _client_args(r)
    r.set_defaults(func=run_rounds)

    x = subparsers.add_parser("export-trace", help="the service's submitted jobs as a trace, to replay offline",
                              description="Every job ever submitted to a service's state database, written in our "
                                          "trace format (arrivals = submission times, the first at 0), to replay "
                                          "the same workload under every policy: arena bench policies --cluster "
                                          "FILE --trace TRACE. Reads the database; no service needs to run. The "
                                          "replay's truth is the simulator's oracle, not what the service measured.")
    _db_arg(x)
    x.add_argument("--out", required=True, metavar="TRACE.csv", help="trace file to write")
    x.set_defaults(func=run_export_trace)

    b = subparsers.add_parser("backup", help="a consistent copy of the service's state database, while it runs",
                              description="A consistent copy of a service's state database, taken with SQLite's "
                                          "online backup while the service may be writing; checked (Store.check) "
                                          "before it is put in place. To restore: stop the service, start it with "
                                          "--db BACKUP (or copy it over the database and remove the database's "
                                          "-wal and -shm files); recovery then reconciles the jobs with what the "
                                          "work folder holds (see docs/service.md).")
    _db_arg(b)
    b.add_argument("--out", required=True, metavar="FILE", help="the copy to write (must not exist)")
    b.add_argument("--json", action="store_true", help="print what was copied as JSON")
    b.set_defaults(func=run_backup)

    from engine.service.store import JOB_STATUSES
    j = subparsers.add_parser("jobs", help="every job of the service (or those in one status)",
                              description="Every job of the service, or those in one status.")
    j.add_argument("--status", choices=JOB_STATUSES, default=None, help="only the jobs in this status")
    j.add_argument("--last", type=int, default=None, metavar="N",
                   help="only the N newest jobs (of that status), still listed by id")
    j.add_argument("--json", action="store_true", help="print JSON")
    _client_args(j)
    j.set_defaults(func=run_jobs)


# ---------------------------------------------------------------------------------- serve
def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _db_arg(p) -> None:
    """``--db``, for the commands that read a service's database directly (no service needed)."""
    p.add_argument("--db", default=".arena/state.db", metavar="PATH",
                   help="the service's state database (default .arena/state.db)")


def _check_writable_file(path: str, flag: str) -> Path:
    """A file this command may create or write (its folder made if missing)."""
    from instances.paths import check_output_file, stat_path
    p = Path(path)
    st = stat_path(p, flag)                   # (a name too long, a link loop: named, not an OSError)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder, not a file", file=str(p), field=flag)
    check_output_file(p, flag)                # really written to: os.access says yes to root and /proc
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _check_db(path: str) -> None:
    """``--db`` of a command that reads a service's database: a path the OS looks at (a
    name too long, a link loop: named, not an ``OSError``) and, when there, no pipe or
    device (SQLite would wait on it, or fail with a disk I/O error). Missing, or a
    folder: ``Store`` says so."""
    from instances.paths import stat_path
    st = stat_path(Path(path), "--db")
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise InputError("not a regular file (a pipe, a device or a socket): not a state database", file=path,
                         field="--db")


def _data_roots(given: list[str] | None) -> tuple[str, ...] | None:
    """``--data-root`` folders, each an existing folder (None: the work folder, made later)."""
    if not given:
        return None
    from instances.paths import stat_path
    for d in given:
        st = stat_path(Path(d).expanduser(), "--data-root")
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise InputError("not an existing folder", file=d, field="--data-root")
    return tuple(given)


def _check_not_the_state(path: str, db: str, flag: str) -> None:
    """An output file that is not the state database nor one of its files (SQLite's
    ``-wal``, ``-shm`` and ``-journal``, the service's lock): writing there would destroy
    the state a service may be running on (a link to one of them counts)."""
    from instances.paths import real_path
    d = Path(db)
    state = [d, *(d.with_name(d.name + s) for s in ("-wal", "-shm", "-journal", DB_LOCK_SUFFIX))]
    p = Path(path)
    try:                                          # by name too: a -wal not made yet would be read as the log
        same = any(real_path(p) == real_path(q) or (p.exists() and q.exists() and os.path.samefile(p, q))
                   for q in state)
    except OSError:
        same = False                              # (unreadable: the writability check names it)
    if same:
        raise InputError(f"is the state database {db} or one of its files; writing it would destroy the "
                         "service's state: give another file", file=str(p), field=flag)


@dataclass(frozen=True)
class ServiceParts:
    """What ``arena serve`` is made of, each part validated (``build_service_parts``)."""
    cluster: Any
    policy: Any
    shadow: Any
    perf: Any
    reconfig: Any
    tokens: Any                 # engine.service.auth.Tokens, or None (loopback without tokens)
    cfg: Any                    # engine.service.config.ServiceConfig
    lock: ServiceLock           # held: one service per state (engine/service/lock.py)
    slurm: Any = None           # engine.service.slurm_nodes.SlurmSetup with --slurm, else None


def build_service_parts(args) -> ServiceParts:
    """Everything ``arena serve`` needs, validated before anything starts."""
    from engine.core.policy import Workload
    from engine.core.reconfig import ReconfigCostModel
    from instances.cluster import ClusterSpec, NodeGroup, load_cluster

    from ..common import build_perf, build_policy, build_shadow, check_policy_on, model_reader, parse_options

    if sum((args.cluster is not None, args.local_slots is not None, bool(args.slurm))) != 1:
        raise InputError("give exactly one of --cluster FILE, --local-slots N and --slurm", field="--cluster")
    slurm_flags = [f for f, v in (("--partition", args.partition), ("--account", args.account),
                                  ("--slurm-opt", args.slurm_opt), ("--slurm-gpu-types", args.slurm_gpu_types),
                                  ("--slurm-tag", args.slurm_tag != "arena"), ("--slurm-conf", args.slurm_conf),
                                  ("--slurm-new-nodes", args.slurm_new_nodes != "restart"))
                   if v]
    if slurm_flags and not args.slurm:
        raise InputError(f"{slurm_flags[0]} goes with --slurm", field=slurm_flags[0])
    slurm = None
    if args.slurm:
        if args.local_nodes != 1:
            raise InputError("--local-nodes goes with --local-slots", field="--local-nodes")
        from engine.service.slurm_nodes import SlurmSettings, SlurmSetup, read_node_record
        with fields_as_flags(SLURM_FLAGS):
            settings = SlurmSettings(partition=args.partition, account=args.account, options=tuple(args.slurm_opt),
                                     gpu_types=args.slurm_gpu_types, tag=args.slurm_tag, conf=args.slurm_conf,
                                     new_nodes=args.slurm_new_nodes)
        # the nodes of the cluster the last service on this work folder ran on keep their node ids
        slurm = SlurmSetup.discover(settings, order=read_node_record(args.work_dir)[0])
        cluster = slurm.cluster
    elif args.local_slots is not None:
        if args.local_slots < 1:
            raise InputError(f"must be >= 1, got {args.local_slots}", field="--local-slots")
        if args.local_nodes < 1:
            raise InputError(f"must be >= 1, got {args.local_nodes}", field="--local-nodes")
        from instances.cluster import MAX_CLUSTER_GPUS
        if args.local_slots * args.local_nodes > MAX_CLUSTER_GPUS:
            raise InputError(f"{args.local_nodes:,} nodes of {args.local_slots:,} slots are more than the "
                             f"{MAX_CLUSTER_GPUS:,} a cluster may have",
                             field="--local-slots" if args.local_slots >= args.local_nodes else "--local-nodes")
        # no host names: every rank runs here, started by mpiexec without a hostfile
        cluster = ClusterSpec((NodeGroup("cpu", args.local_nodes, args.local_slots),),
                              f"local-{args.local_slots}" if args.local_nodes == 1
                              else f"local-{args.local_nodes}x{args.local_slots}")
    else:
        if args.local_nodes != 1:
            raise InputError("--local-nodes goes with --local-slots", field="--local-nodes")
        cluster = load_cluster(args.cluster)
        missing = [g.gpu_type for g in cluster.groups if g.hosts is None]
        if missing:
            raise InputError(f"node groups of {', '.join(missing)} have no \"hosts\" (one host name per node): the "
                             "service must know where to launch ranks", file=args.cluster, field="hosts")
    if not 1 <= args.port <= 65535:
        raise InputError(f"must be in 1..65535, got {args.port}", field="--port")
    _check_host(args.host)                        # (a name that is no address is not a question of tokens)
    tokens = _tokens(args)
    if not _is_loopback(args.host) and tokens is None:
        raise InputError(f"binding to {args.host} (not loopback) needs API tokens (--token, ARENA_TOKEN or "
                         "--tokens-file): without one, anyone who reaches the port may cancel any job",
                         field="--token")
    opts = parse_options(args.policy_opt, "--policy-opt")
    policy = build_policy(args.policy, opts)
    shadow = build_shadow(args)
    check_policy_on(policy, Workload("the live service"))        # its jobs: fixed-batch (before anything starts)
    if shadow is not None:
        check_policy_on(shadow, Workload("the live service"), name_flag="--shadow-policy",
                        opt_flag="--shadow-policy-opt")
    # the jobs run on our launcher: its runtime
    perf = build_perf(args.perf, model_reader(args), args.profile_store)
    reconfig_opts = parse_options(args.reconfig_opt, "--reconfig-opt")
    try:
        reconfig = ReconfigCostModel.from_options(reconfig_opts)
    except (TypeError, ValueError) as e:
        raise InputError(str(e), field="--reconfig-opt") from None
    _check_policies_decide(args, opts, cluster, perf, reconfig)
    work = Path(args.work_dir)
    from instances.paths import check_output_dir
    check_output_dir(work, "--work-dir")          # (before resolve(): a link loop was a RuntimeError)
    given = config_values(args, ServiceConfig)
    given.update(db_path=str(Path(args.db_path)), work_dir=str(work.resolve()), data_roots=_data_roots(args.data_roots))
    with fields_as_flags(SERVE_FLAGS):            # every option checked before a file or folder is made
        cfg = ServiceConfig(**given)
    from engine.service.store import check_state_file
    check_state_file(Path(args.db_path), "--db")
    _check_writable_file(args.db_path, "--db")
    if work.exists() and not work.is_dir():
        raise InputError("is a file, not a folder", file=str(work), field="--work-dir")
    # one service per state, checked before the port (a second service may be given another port)
    # and before anything is touched (the work folder is made once the database's lock is held):
    # held until this process ends (engine/service/lock.py)
    lock = ServiceLock.acquire(cfg.db_path, cfg.work_dir)
    try:
        _check_port(args.host, args.port)
    except BaseException:
        lock.release()
        raise
    return ServiceParts(cluster, policy, shadow, perf, reconfig, tokens, cfg, lock, slurm)


def _check_host(host: str) -> None:
    """``--host`` names an address of this machine (an IP address, or a name that
    resolves to one): bound once on any free port, as the server will bind it."""
    if not host.strip():
        raise InputError("is empty; give an address to bind (127.0.0.1, the default, for this machine only)",
                         field="--host")
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as e:
        raise InputError(f"{host!r} is not an address this machine can bind: it does not resolve "
                         f"({getattr(e, 'strerror', None) or e})", field="--host") from None
    _check_port(host, 0)


def _check_policies_decide(args, opts: dict, cluster, perf, reconfig) -> None:
    """The policy (and the shadow policy) can decide this service's jobs: a copy of each,
    built for the trial, decides one round of one job (engine/service/probe.py)."""
    from engine.core.policy import make_policy
    from engine.service.probe import check_policy_decides

    from ..common import parse_options
    check_policy_decides(make_policy(args.policy, **opts), cluster, perf, reconfig, flag="--policy")
    if args.shadow_policy is not None:
        shadow_opts = parse_options(args.shadow_policy_opt, "--shadow-policy-opt")
        check_policy_decides(make_policy(args.shadow_policy, **shadow_opts), cluster, perf, reconfig,
                             flag="--shadow-policy")


def _check_port(host: str, port: int) -> None:
    """The address is free to bind (as the server will): an address of another machine is
    the fault of ``--host``, a port in use (or below 1024 without the right) of ``--port``."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)      # as the server will
        try:
            sock.bind((host, port))
        except OSError as e:
            wrong_host = isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL or port == 0
            raise InputError(f"cannot bind {host}:{port or 'a free port'}: {e.strerror or e}"
                             + (" (not an address of this machine)" if e.errno == errno.EADDRNOTAVAIL else ""),
                             field="--host" if wrong_host else "--port") from None


def _tokens(args):
    """The service's tokens (``engine/service/auth.py``): ``--tokens-file``, else
    ``--token`` (or ``$ARENA_TOKEN``); None: neither. Each token is checked."""
    from engine.service.auth import Tokens
    if args.tokens_file is not None:
        if args.token is not None:
            raise InputError("give --token (one user) or --tokens-file (a token per user), not both",
                             field="--tokens-file")
        return Tokens.from_file(args.tokens_file)
    if args.token is not None:
        return Tokens.single(args.token, field="--token")
    env = os.environ.get("ARENA_TOKEN")
    return None if env is None else Tokens.single(env, field="ARENA_TOKEN")


SERVICE_EXTRA = "pip install -e '.[service]'"     # what brings FastAPI and uvicorn (pyproject.toml)


def _check_service_extra() -> None:
    """FastAPI and uvicorn (the ``service`` extra) are installed; else an error that says
    which extra to install (the clients talk HTTP with the standard library: they need none)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as e:
        raise InputError(f"arena serve needs the 'service' extra (FastAPI and uvicorn; no module named "
                         f"{e.name!r}): {SERVICE_EXTRA}") from None


def run_serve(args) -> int:
    import signal
    import threading

    _check_service_extra()                        # before any option is checked or file made
    from engine.service.api import ApiContext, create_app
    from engine.service.daemon import Service, fault_from_env
    from engine.service.http_server import server as http_server

    parts = build_service_parts(args)
    cluster, policy, shadow, perf, reconfig, tokens, cfg, lock = (
        parts.cluster, parts.policy, parts.shadow, parts.perf, parts.reconfig, parts.tokens, parts.cfg, parts.lock)
    log = lambda m: print(f"[arena serve {time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    service = Service(cluster, policy, perf, reconfig, cfg, log=log, fault=fault_from_env(log), shadow=shadow,
                      lock=lock, slurm=parts.slurm)
    app = create_app(ApiContext(cfg.db_path, cfg.work_dir, cluster, service.policy_name, tokens,
                                shadow_policy=service.shadow_name, data_roots=cfg.data_roots,
                                wake=service.wake.set, check=service.check_runnable, liveness=service.liveness,
                                node_failures=service.node_failures,
                                slurm_nodes=None if service.slurm_nodes is None else service.slurm_nodes.peek,
                                slurm_jobs=None if service.slurm_nodes is None else service.slurm_nodes.jobs,
                                host_watch=None if service.host_watch is None else service.host_watch.peek,
                                plugins=tuple(p.describe() for p in args.plugins),
                                local_hosts=None if tokens else LOCAL_HOSTS | {args.host.lower()}))
    server = http_server(app, args.host, args.port)
    stop = threading.Event()
    failure: list[BaseException] = []

    def scheduler() -> None:
        try:
            service.run(stop)
        except BaseException as e:          # the API must not outlive its scheduler
            failure.append(e)
            log(f"scheduler stopped on an error: {type(e).__name__}: {e}")
        finally:
            server.should_exit = True

    terminated = threading.Event()                # SIGTERM: no restart in place

    def on_term(*_) -> None:
        terminated.set()
        stop.set()
    signal.signal(signal.SIGTERM, on_term)        # uvicorn re-raises it after its own shutdown
    thread = threading.Thread(target=scheduler, name="arena-scheduler", daemon=True)
    thread.start()
    log(f"API and status page on http://{args.host}:{args.port}/ ("
        + (f"tokens required: {tokens.describe()}" if tokens else "no token: any local user may do anything") + ")")
    try:
        server.run()
    finally:
        stop.set()
        thread.join()
    if failure:
        e = failure[0]
        if isinstance(e, InputError):
            raise e
        return 1
    if service.restart_in_place and not terminated.is_set():   # (store closed, lock released: daemon.py)
        _restart_in_place()
    return 0


def _restart_in_place() -> None:
    """Execute this ``arena serve`` command line again in this process (same PID, same
    standard streams; every file this process opened is closed: Python opens them
    close-on-exec), to take in the nodes the Slurm partition gained."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


# -------------------------------------------------------------------------------- clients
def _client(args) -> Client:
    """The client of ``--url`` and ``--token``, a refusal named by the environment variable
    that set the value, where one did (``ARENA_URL``, ``ARENA_TOKEN``)."""
    def field(value, flag: str, env: str) -> str:
        return env if value is not None and value == os.environ.get(env) else flag
    return Client(args.url, args.token, url_field=field(args.url, "--url", "ARENA_URL"),
                  token_field=field(args.token, "--token", "ARENA_TOKEN"))


def run_submit(args) -> int:
    flags = {k: getattr(args, k) for k in ("name", "model", "global_batch", "steps", "gpus", "gpu_type", "after")
             if getattr(args, k) is not None}
    if args.file:
        if flags:
            raise InputError("give a job file or flags, not both", field="file")
        p = Path(args.file)
        if not p.is_file():
            raise InputError("job file not found" if not p.exists() else "not a file", file=str(p))
        from engine.service.jobspec import JobSpec
        spec = JobSpec.from_toml(p)               # checked here too: the error names the file and line
        body = spec.to_dict()
    else:
        missing = [f"--{f.replace('global_batch', 'batch')}" for f in ("name", "model", "global_batch", "steps")
                   if f not in flags]
        if missing:
            raise InputError(f"missing {', '.join(missing)} (or give a JOB.toml)", field=missing[0])
        if str(flags["model"]).lower().endswith(".json"):
            flags["model"] = str(Path(flags["model"]).resolve())
        from engine.service.jobspec import JobSpec
        try:                                      # checked here too, as a job file is
            spec = JobSpec.from_dict(flags, source="the command line")
        except InputError as e:
            flag = {"global_batch": "--batch", "gpu_type": "--gpu-type"}.get(e.field or "", f"--{e.field}")
            raise InputError(e.reason, field=flag) from None
        body = {k: v for k, v in spec.to_dict().items() if k in flags}    # (the service fills the rest)
    key = args.key if args.key is not None else uuid.uuid4().hex
    try:
        ans = _client(args).post("/api/jobs", body, key=key)
    except NoAnswer as e:
        if e.maybe_done:                          # it may have stored the job: the same key is safe to resend
            raise InputError(f"{e.reason}; to submit without risking a second copy, run this again with "
                             f"--key {key}", field=e.field) from None
        raise
    if args.json:
        print(dumps(ans))
    else:
        print(f"{'already submitted as' if ans.get('replayed') else 'submitted'} job {ans['id']} ({ans['name']})")
    return 0


def _plan(p: dict | None) -> str:
    if not p:
        return "-"
    return (f"dp{p.get('dp')}xtp{p.get('tp')}xpp{p.get('pp')} {p.get('gpu_type')} "
            f"{p.get('nodes')}x{p.get('gpus_per_node')}")


def _table(jobs: list[dict]) -> str:
    rows = [f"{'id':>4} {'name':<16} {'status':<10} {'plan':<28} {'steps':>11} {'samples/s':>10} {'loss':>12} "
            f"{'launches':>8} {'moves':>5}"]
    notes = {}
    for j in jobs:
        pr = j["progress"]
        thr = pr.get("throughput_samples_per_s")
        thr_s = f"{thr:.1f}" if thr else "-"
        if thr:
            from engine.service.views import RATE_WINDOW_S
            notes["rate"] = f"samples/s: a running job's steps over its last {RATE_WINDOW_S:g} s (wall clock)"
        done = pr.get("iterations_done") or 0
        loss_s = "-" if j.get("loss") is None else f"{j['loss']:.4f}"
        if j.get("loss") is not None and (j.get("loss_step") or 0) < done:     # an older step's loss: say which
            loss_s += f"@{j['loss_step']}"
            notes["loss"] = ("loss@N: step N's, the latest its launches in this database recorded (later ones' "
                             "folders were set aside: a database restored from an older copy)")
        steps = f"{done}/{j['steps']}"
        rows.append(f"{j['id']:>4} {j['name'][:16]:<16} {j.get('state', j['status']):<10} {_plan(j['plan'])[:28]:<28} "
                    f"{steps:>11} {thr_s:>10} {loss_s:>12} {j['launches']:>8} {j['moves']:>5}")
    return "\n".join(rows + list(notes.values()))


def run_status(args) -> int:
    if not (math.isfinite(args.patience) and args.patience >= 0):
        raise InputError(f"must be a finite number of seconds >= 0, got {args.patience}", field="--patience")
    check_time(args.patience, field="--patience")
    cl = _client(args)
    silent_since = None                 # --watch: when the service stopped answering
    while True:
        try:
            ended = _show_status(cl, args)
        except NoAnswer:
            if not args.watch:
                raise
            now = time.monotonic()
            silent_since = silent_since or now
            if now - silent_since > args.patience:
                raise
            print(f"no answer from {args.url} for {now - silent_since:.0f} s (restarting?); waiting up to "
                  f"{args.patience:g} s", file=sys.stderr)
            time.sleep(2.0)
            continue
        silent_since = None
        if not args.watch or ended:
            return 0
        sys.stdout.flush()
        time.sleep(2.0)
        print()


def move_line(m: dict) -> str:
    """One move-ledger row for people: when, where to, what was expected, what it made
    (``views.move_summary``, which the page shows too)."""
    from engine.service.views import move_summary
    return f"{time.strftime('%H:%M:%S', time.localtime(m['at']))} {move_summary(m)['text']}"


def _show_status(cl: Client, args) -> bool:
    """Print the jobs (or one job); True when every one shown has ended."""
    from engine.service.store import TERMINAL
    if args.id is not None:
        job = cl.get(f"/api/jobs/{args.id}")
        if args.json:
            print(dumps(job, indent=1))
        else:
            print(_table([job]))
            extra = [f"priority {job['priority']:g}"] if job.get("priority", 1.0) != 1.0 else []
            if job.get("after"):
                waiting = ", ".join(map(str, job["waiting_for"]))
                extra.append(f"after job(s) {', '.join(map(str, job['after']))}"
                             + (f", waiting for {waiting}" if waiting else ""))
            if job.get("hold_requested") or job.get("cancel_requested"):
                extra.append("hold requested" if job.get("hold_requested") else "cancel requested")
            if job.get("submitted_by"):
                extra.append(f"submitted by {job['submitted_by']}")
            if extra:
                print("; ".join(extra))
            if job.get("moving"):
                mv = job["moving"]
                print(f"moving {mv['path']}" + (": its ranks keep training until they move" if mv["ranks_training"]
                                                 else ""))
            if job.get("waits"):
                print(f"waits: {job['waits']}")
            if job.get("smaller"):
                print(f"smaller: {job['smaller']}")
            if job.get("slurm"):
                sj = job["slurm"]
                print(f"Slurm: batch job {sj['job_id']} {sj['state']}" + (f" ({sj['reason']})" if sj.get("reason")
                                                                         and sj["reason"] != "None" else ""))
            print("history:")
            for h in job["history"]:
                print(f"  {time.strftime('%H:%M:%S', time.localtime(h['at']))} {h['from'] or '-'} -> {h['to']}: "
                      f"{h['reason']}")
            if job.get("move_ledger"):
                print("moves (expected: the estimate the decision used; made: measured since the move):")
                for m in job["move_ledger"]:
                    print("  " + move_line(m))
        return job["status"] in TERMINAL
    jobs = cl.get("/api/jobs")
    print(dumps(jobs, indent=1) if args.json else _table(jobs))
    return all(j["status"] in TERMINAL for j in jobs)


def run_cancel(args) -> int:
    ans = _client(args).post(f"/api/jobs/{args.id}/cancel")
    print(f"cancel of job {ans['id']} requested (it was {ans['status']})")
    return 0


def run_hold(args) -> int:
    ans = _client(args).post(f"/api/jobs/{args.id}/hold", {"reason": args.reason})
    if ans["already"]:
        print(f"job {ans['id']} is already held or its hold requested ({ans['status']})")
    else:
        print(f"hold of job {ans['id']} requested (it was {ans['status']}); `arena release {ans['id']}` returns it")
    return 0


def run_release(args) -> int:
    ans = _client(args).post(f"/api/jobs/{args.id}/release")
    if ans["released"] == "released":
        print(f"job {ans['id']} released: back in the queue")
    else:
        print(f"job {ans['id']}: its hold, not yet carried out, was withdrawn ({ans['status']})")
    return 0


def run_priority(args) -> int:
    check_priority(args.priority)                       # checked here too: nothing sent
    ans = _client(args).post(f"/api/jobs/{args.id}/priority", {"priority": args.priority, "reason": args.reason})
    print(f"job {ans['id']}: priority {ans['was']:g} -> {ans['priority']:g} ({ans['status']}); the next round "
          f"decides with it")
    return 0


def run_drain(args) -> int:
    """``arena drain`` and ``arena undrain``."""
    from urllib.parse import quote
    drain = args.drain
    path = f"/api/nodes/{quote(str(args.node), safe='')}/{'drain' if drain else 'undrain'}"
    ans = _client(args).post(path, {"reason": args.reason} if drain else {})
    state = "drained" if drain else "returned to service"
    print(f"node {ans['node']} {'was already ' if ans['already'] else ''}{state}")
    return 0


def run_nodes(args) -> int:
    cl = _client(args).get("/api/cluster")
    if args.json:
        print(dumps(cl, indent=1))
        return 0
    slurm = cl.get("slurm")
    print(f"{'node':>4} {'host':<16} {'type':<12} {'held':>7}  " + ("slurm      " if slurm else "")
          + "jobs / out of service")
    for n in cl["nodes"]:
        jobs = sorted({g["job"] for g in n["gpus"] if g["job"] is not None})
        held = sum(g["job"] is not None for g in n["gpus"])
        notes = [f"drained: {n['drained']['reason']}"] if n["drained"] else []
        sn = n.get("slurm") or {}
        if sn.get("out_of_service"):
            notes.append(f"out (Slurm, last round): {sn['out_of_service']}")
        hc = n.get("host_check") or {}
        if hc.get("out_of_service"):
            notes.append(f"out: {hc['out_of_service']}")
        elif hc and not hc["answers"]:
            notes.append(f"host {hc['host']} does not answer now ({hc['error']}); in service until "
                         f"--host-down-after")
        state = f"{sn.get('state') or '?':<10} " if slurm else ""
        print(f"{n['node']:>4} {str(n['host'] or '-'):<16} {n['gpu_type']:<12} {held:>3}/{len(n['gpus']):<3}  "
              f"{state}{' '.join(map(str, jobs)) or '-'}{'  ' + '; '.join(notes) if notes else ''}")
    if slurm:
        if slurm.get("error"):
            print(f"Slurm's state could not be read now: {slurm['error']}")
        if slurm.get("new_nodes"):
            print(f"in partition {slurm['partition']} but not in the cluster read at start (a restart takes them): "
                  f"{', '.join(slurm['new_nodes'])}")
    return 0


def run_logs(args) -> int:
    from engine.service.views import MAX_LOG_CHARS
    if not 0 <= args.chars <= MAX_LOG_CHARS:
        raise InputError(f"must be in 0..{MAX_LOG_CHARS}, got {args.chars}", field="--chars")
    ans = _client(args).get(f"/api/jobs/{args.id}/logs?chars={args.chars}")
    if ans["launch"] is None:
        print(f"job {args.id} has not been launched yet")
        return 0
    print(f"== job {args.id}, launch {ans['launch']}: stdout ==")
    print(ans["stdout"].rstrip())
    print(f"== job {args.id}, launch {ans['launch']}: stderr ==")
    print(ans["stderr"].rstrip())
    return 0


def run_rounds(args) -> int:
    from engine.core.shadow import counts_line
    from engine.service.views import MAX_ROUNDS_SHOWN
    if not 1 <= args.last <= MAX_ROUNDS_SHOWN:
        raise InputError(f"must be in 1..{MAX_ROUNDS_SHOWN}, got {args.last}", field="--last")
    client = _client(args)
    rounds, shadow = client.get(f"/api/rounds?last={args.last}"), client.get("/api/shadow")
    if args.json:
        print(dumps({"rounds": rounds, "shadow": shadow}, indent=1))
        return 0
    for r in rounds:
        d = r["decisions"]
        print(f"round {r['index']:>5} {time.strftime('%H:%M:%S', time.localtime(r['at']))} {r['trigger']:<24} "
              f"{d.get('jobs', 0):>3} jobs, {len(d.get('grids', {})):>3} placed, {r['solve_time_s']:.3f} s")
        if d.get("shadow"):
            print("      " + shadow_line(d["shadow"]))
    for name, c in shadow["counts"].items():
        print(counts_line(name, c))
    return 0


def shadow_line(c: dict) -> str:
    """One round's shadow comparison (engine/core/shadow.py ``to_dict``) as one line."""
    if c["error"]:
        return f"shadow {c['policy']}: failed: {c['error']}"
    diff = ", ".join(f"job {d['job']} {d['primary'] or 'waits'} -> {d['shadow'] or 'waits'}" for d in c["differ"])
    more = c["disagreements"] - len(c["differ"])
    ratio = "" if c["rate_ratio"] is None else f"; est. rate on the grids that differ x{c['rate_ratio']:.2f}"
    return (f"shadow {c['policy']}: same grid for {c['agree']}/{c['jobs']} jobs; moves or stops "
            f"{c['changes'][0]} vs {c['changes'][1]}; GPUs {c['gpus'][0]} vs {c['gpus'][1]}{ratio}"
            + (f"; differs: {diff}" if diff else "") + (f" (+{more} more)" if more > 0 else ""))


def run_export_trace(args) -> int:
    from engine.service.export import workload
    from engine.service.store import Store
    from instances.traces import write_trace
    _check_db(args.db)
    _check_not_the_state(args.out, args.db, "--out")
    out = _check_writable_file(args.out, "--out")
    with Store(args.db, readonly=True) as st:
        st.refuse_unreadable(field="--db")         # (a running service may be writing: the rest is its own)
        jobs, statuses = workload(st, args.db)
        after = sum(1 for r in st.jobs.rows() if r.spec.get("after"))
    write_trace(jobs, out, "--out")
    span = max(j.arrival_s for j in jobs)
    print(f"arena export-trace: {len(jobs)} job(s) over {span:.0f} s of submissions written to {out} (live: "
          + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + "; every one is replayed to its last step)"
          + (f"; {after} ran after others and arrive at their submission (a trace has no dependencies)"
             if after else ""), file=sys.stderr)
    return 0


def run_backup(args) -> int:
    from engine.service.store import SCHEMA_VERSION, Store
    from instances.paths import stat_path
    _check_db(args.db)
    _check_not_the_state(args.out, args.db, "--out")          # (a backup named <db>-wal would be read as its WAL)
    out = Path(args.out)
    if stat_path(out, "--out") is not None:
        raise InputError("already exists; a backup does not overwrite", file=str(out), field="--out")
    out = _check_writable_file(args.out, "--out")
    t0 = time.monotonic()
    with Store(args.db, readonly=True) as st:
        st.refuse_unreadable(field="--db")         # (a copy would be refused at its check: say it of this one)
        st.backup(out)
    with Store(out, readonly=True) as copy:
        counts = {k: v for k, v in copy.jobs.status_counts().items() if v}
        last = copy.rounds.rows(last=1)
    report = {"db": str(args.db), "out": str(out), "bytes": out.stat().st_size, "schema_version": SCHEMA_VERSION,
              "jobs": counts, "last_round": last[0].idx if last else None, "seconds": time.monotonic() - t0}
    if args.json:
        print(dumps(report))
    print(f"arena backup: {out} ({report['bytes']:,} bytes, schema {SCHEMA_VERSION}, checked): "
          + (", ".join(f"{n} {s}" for s, n in counts.items()) or "no jobs")
          + (f"; last round {report['last_round']}" if last else ""), file=sys.stderr)
    return 0


def run_jobs(args) -> int:
    if args.last is not None and args.last < 1:
        raise InputError(f"must be >= 1, got {args.last}", field="--last")
    query = [f"status={args.status}"] * bool(args.status) + [f"last={args.last}"] * (args.last is not None)
    jobs = _client(args).get("/api/jobs" + ("?" + "&".join(query) if query else ""))
    print(dumps(jobs, indent=1) if args.json else _table(jobs))
    return 0
