"""``arena serve --slurm`` against a real Slurm cluster on this host (``tests/slurm_cluster.py``):
four one-GPU nodes n1-n4 (GRES ``gpu:a100:1``), a CPU node n5, in a partition of its own
a node n6 whose GRES type (``xpu9``) the type table lacks, and in another (``spare``) an H100
node n7 that the service's partition gains mid-run.

One service run (the ``fcfs`` policy, so that each job runs on the shape it asks for) goes
through every scenario in turn:

- three jobs start: one data-parallel across two Slurm nodes, one on one GPU node, one on
  the CPU node; ``arena nodes`` shows Slurm's state as ``sinfo`` does;
- the service is SIGKILLed mid-run and started again: it takes over the same Slurm jobs
  (no new launch, no new Slurm job; the jobs trained on while it was down);
- at once, ``scontrol update state=drain`` on the one-GPU job's node (the job moves to the
  free GPU node within two rounds; ``state=resume``: the node is offered again, and a new
  job lands on it, the only free GPU node) and an outside ``scancel`` of the CPU job's
  Slurm job (a failed run, counted against its node, that resumes from its checkpoint);
- the partition gains n7 (``scontrol update partitionname``): the service restarts in place
  (the same PID; nothing relaunched, the same Slurm jobs run on) and a job asking for an
  H100 runs on n7;
- the controller stopped while jobs run (the job on n7 among them, just launched; the
  restarted controller reads the slurm.conf that added n7): the rounds wait, ``arena
  nodes`` says why, no job is stopped, and the service carries on once it answers again
  (nodes in state UNKNOWN until their slurmd registers with the restarted controller stay
  in service). A launch whose batch script reached Hydra's ``srun`` while the controller
  was away never starts its ranks (docs/slurm.md): ``--launch-stall-after`` (120 s here)
  ends it, and the job is launched again (``test_launcher_slurm`` has that case for sure);
- a node that leaves the partition (``scontrol update partitionname``) is out of service
  until it is back.

Every job trains to the end on the one-process losses (``LOSS_TOL``), the taken-over job
without a step lost or trained twice, every resumed launch from its last checkpoint.
Bad inputs at start are each one clear error line (``test_bad_slurm_inputs_at_start``).
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from engine.service.client import Client
from engine.service.scenario import LOSS_TOL, Submission, free_port, loss_deviation, resumes
from engine.service.store import Store
from launcher.launch import read_results
from launcher.telemetry import read_progress
from tests.service_run import ServiceRun
from tests.slurm_cluster import NodeDef, SlurmCluster, started_cluster, unavailable
from tests.test_engine_helpers import wait_until

NODES = (NodeDef("n1", gpus=1), NodeDef("n2", gpus=1), NodeDef("n3", gpus=1), NodeDef("n4", gpus=1),
         NodeDef("n5", cpus=2), NodeDef("n6", gpus=1, gpu_type="xpu9", partition="odd"),
         NodeDef("n7", gpus=1, gpu_type="h100", partition="spare"))
ARENA = tuple(n.name for n in NODES if n.partition is None)          # the service's partition at start
GPU = "a100-40gb"
STEPS = 60
JOB = {"model": "tiny-gpt__2L", "global_batch": 8, "steps": STEPS}
ACROSS = {"name": "across", **JOB, "gpus": 2, "gpu_type": GPU}      # dp=2, one rank on each of two nodes
MOVER = {"name": "mover", **JOB, "gpus": 1, "gpu_type": GPU}        # its node drained: moved
ON_CPU = {"name": "on-cpu", **JOB, "gpus": 1, "gpu_type": "cpu"}    # cancelled from outside
LATE = {"name": "late", **JOB, "steps": 12, "gpus": 1, "gpu_type": GPU}   # lands on the node given back
ON_NEW = {"name": "on-new", **JOB, "steps": 12, "gpus": 1, "gpu_type": "h100-sxm"}   # on n7, once gained
TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def cluster():
    why = unavailable()
    if why:
        pytest.skip(why)
    with started_cluster(NODES) as c:
        yield c


def serve_args(cluster: SlurmCluster, tmp: Path, port: int) -> list[str]:
    return ["--slurm", "--slurm-conf", str(cluster.conf), "--policy", "fcfs", "--db", str(tmp / "state.db"),
            "--work-dir", str(tmp / "work"), "--port", str(port), "--round-interval", "2",
            "--checkpoint-interval", "1", "--step-delay", "0.4", "--failure-backoff", "0", "--stop-timeout", "30",
            "--launch-stall-after", "120", "--stop-after", "600"]


def wait_for(pred, what: str, timeout_s: float = 90.0, poll_s: float = 0.3):
    return wait_until(pred, timeout_s, what, poll_s)


class Run(ServiceRun):
    """The service run and what the scenario saw, for the tests below."""

    def __init__(self, cluster: SlurmCluster, tmp: Path):
        super().__init__(tmp)
        self.cluster = cluster

    def args(self) -> list[str]:
        return serve_args(self.cluster, self.tmp, self.port)

    # --- reading -----------------------------------------------------------------------------
    def hosts(self, launch) -> list[str]:
        """The Slurm nodes of a launch (its GPUs' node ids -> host names, from /api/cluster)."""
        names = {n["node"]: n["host"] for n in self.client.get("/api/cluster")["nodes"]}
        return sorted({names[int(g.split(":")[0])] for g in launch.gpus})

    def last_round(self) -> int:
        with self.store() as st:
            return max((x.idx for x in st.rounds.rows()), default=0)

    def running(self, name: str):
        """The job's latest launch when it is started and Slurm runs it, else None."""
        ls = self.launches(name)
        if not ls or ls[-1].state != "started" or not (ls[-1].pid_info or {}).get("slurm_job_id"):
            return None
        return ls[-1]

    def our_slurm_jobs(self) -> dict[int, str]:
        """Slurm job id -> name of this service's jobs Slurm runs now."""
        out = self.cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i %j").stdout.split("\n")
        return {int(i): n for i, n in (ln.split() for ln in out if ln.strip()) if n.startswith("arena.")}

    def nodes_vs_sinfo(self, timeout_s: float = 20.0) -> tuple[dict, dict] | None:
        """``arena nodes --json``'s Slurm states against ``sinfo`` read just after, until they
        agree (a state may change between the two reads): None, else the last two readings."""
        deadline = time.monotonic() + timeout_s
        while True:
            shown = {n["host"]: n["slurm"]["state"] for n in json.loads(self.arena_nodes("--json"))["nodes"]}
            sinfo = {k: v for k, v in self.cluster.node_states().items() if k in shown}
            if shown == sinfo:
                return None
            if time.monotonic() > deadline:
                return shown, sinfo
            time.sleep(0.5)


def scenario(r: Run) -> None:
    c, seen, t0 = r.cluster, r.seen, time.monotonic()
    phase = lambda what: seen.setdefault("phases", []).append((what, round(time.monotonic() - t0)))  # noqa: E731
    r.start()
    for spec in (ACROSS, MOVER, ON_CPU):
        r.submit(spec)
    names = ("across", "mover", "on-cpu")
    wait_for(lambda: all(r.running(n) and r.steps(n) >= 1 for n in names), "the three jobs running")
    phase("three jobs running")
    seen["across_hosts"] = r.hosts(r.running("across"))
    seen["across_plan"] = r.running("across").plan
    seen["nodes_vs_sinfo_start"] = r.nodes_vs_sinfo()

    # --- kill -9 and restart: the same Slurm jobs run on, taken over ------------------------
    before = {n: (len(r.launches(n)), r.running(n).pid_info["slurm_job_id"]) for n in names}
    slurm_before = r.our_slurm_jobs()
    r.sp.kill()
    at_kill = {n: r.steps(n) for n in names}
    r.start()
    wait_for(lambda: r.log().count("nothing relaunched") >= 3, "the restarted service took over the three jobs")
    phase("restarted, jobs taken over")
    seen["trained_while_down"] = {n: r.steps(n) - at_kill[n] for n in names}
    seen["restart"] = (before, {n: (len(r.launches(n)), r.running(n).pid_info["slurm_job_id"]) for n in names},
                       slurm_before, r.our_slurm_jobs())

    # --- at once: a Slurm drain under one job, an outside scancel of another ------------------
    # the drained node's job moves to the free GPU node within two rounds; the cancelled one
    # (a failed run, counted against its node) resumes from its checkpoint
    host = r.hosts(r.running("mover"))[0]
    seen["drained_host"], gen = host, r.launches("mover")[-1].generation
    cancelled = r.running("on-cpu")
    seen["cancelled"] = cancelled.pid_info["slurm_job_id"]
    progress = r.tmp / "work" / str(r.ids["on-cpu"]) / "progress.json"
    wait_for(lambda: int((read_progress(progress) or {}).get("last_checkpoint_step") or 0) > 0, "a checkpoint")
    t_drain = time.time()
    c.run("scontrol", "update", f"nodename={host}", "state=drain", "reason=arena-test")
    c.run("scancel", str(seen["cancelled"]))
    moved = wait_for(lambda: (lch := r.running("mover")) and lch.generation > gen and lch, "the drained job moved")
    seen["drain_to_move_s"] = moved.created_at - t_drain
    phase("drained job moved")
    seen["moved_to"] = r.hosts(moved)
    with r.store() as st:
        seen["rounds_to_move"] = [x.trigger for x in st.rounds.rows() if t_drain <= x.at <= moved.created_at]
    seen["nodes_vs_sinfo_drained"] = r.nodes_vs_sinfo()
    seen["nodes_text_drained"] = r.arena_nodes()
    c.run("scontrol", "update", f"nodename={host}", "state=resume")
    wait_for(lambda: next(n for n in r.client.get("/api/cluster")["nodes"] if n["host"] == host)["slurm"]
             ["out_of_service"] is None, "the resumed node back in service")
    r.submit(LATE)
    wait_for(lambda: (lch := r.running("on-cpu")) and lch.generation > cancelled.generation,
             "the cancelled job relaunched")
    with r.store() as st:
        seen["cancel_reason"] = next(lch.reason for lch in st.launches.rows(r.ids["on-cpu"])
                                     if lch.generation == cancelled.generation)
        seen["node_failures"] = st.nodes.failures(0.0)
    seen["late_hosts"] = r.hosts(wait_for(lambda: r.running("late"), "the late job running"))
    phase("cancelled job relaunched, the resumed node took the late job")

    # --- the partition gains n7: the service restarts in place, the Slurm jobs run on -----------
    pid, mark = r.sp.proc.pid, len(r.log())
    launches = {n: (len(r.launches(n)), (r.launches(n)[-1].pid_info or {}).get("slurm_job_id")) for n in r.ids}
    c.run("scontrol", "update", "partitionname=arena", f"nodes={','.join(ARENA)},n7")
    # (and in slurm.conf, as an operator would: the controller restarted below reads it)
    c.conf.write_text(re.sub(r"(PartitionName=arena Nodes=\S+)", r"\1,n7", c.conf.read_text()))
    wait_for(lambda: "scheduling " in r.log()[mark:].partition("restarting in place")[2],
             "the service restarted in place", 60)
    r.sp.wait_healthy(60)
    seen["gain"] = (pid, r.sp.proc.pid, r.sp.alive(), launches,
                    {n: (len(r.launches(n)), (r.launches(n)[-1].pid_info or {}).get("slurm_job_id")) for n in r.ids},
                    r.our_slurm_jobs(), r.log()[mark:])
    r.submit(ON_NEW)
    seen["on_new_hosts"] = r.hosts(wait_for(lambda: r.running("on-new"), "the job on the new node running"))
    phase("n7 gained: restarted in place, a job on n7")

    # --- the controller stops answering while jobs run, and comes back -------------------------
    launches = {n: len(r.launches(n)) for n in r.ids}
    mark = len(r.log())
    ctld = c.procs.pop("slurmctld")
    ctld.terminate()
    ctld.wait(timeout=30)
    wait_for(lambda: "rounds wait until it answers" in r.log()[mark:], "the service noticed the controller down", 60)
    seen["nodes_text_down"] = r.arena_nodes()
    seen["health_down"] = r.client.get("/api/health")
    c._spawn("slurmctld", [shutil.which("slurmctld", path="/usr/sbin:/usr/bin:/sbin") or "slurmctld", "-D"])
    wait_for(lambda: "the Slurm controller answers again" in r.log()[mark:], "the service noticed the controller",
             60)
    time.sleep(6.0)                              # rounds are due every 2 s (recorded when they decide something)
    seen["controller_back"] = (launches, {n: len(r.launches(n)) for n in r.ids}, r.log()[mark:])
    phase("controller back")

    wait_for(lambda: all(r.status(n) in ("finished", "failed") for n in r.ids), "every job ended", TIMEOUT_S)
    phase("every job ended")

    # --- a node leaves the partition, then comes back ----------------------------------------
    part = ",".join(n for n in (*ARENA, "n7") if n != "n4")
    c.run("scontrol", "update", "partitionname=arena", f"nodes={part}")
    node4 = lambda: next(n for n in r.client.get("/api/cluster")["nodes"] if n["host"] == "n4")["slurm"]  # noqa: E731
    seen["gone"] = wait_for(lambda: node4()["out_of_service"], "n4 out of service once gone from the partition", 30)
    c.run("scontrol", "update", "partitionname=arena", f"nodes={','.join(ARENA)},n7")
    wait_for(lambda: node4()["out_of_service"] is None, "n4 back in service", 30)
    seen["exit"] = r.sp.terminate()
    phase("stopped")


@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
    r = Run(cluster, tmp_path_factory.mktemp("serve-slurm"))
    t0 = time.monotonic()
    try:
        scenario(r)
    except BaseException:
        print(r.log()[-6000:], file=sys.stderr)
        raise
    finally:
        if r.sp is not None:
            r.sp.terminate()
    print(f"\nthe Slurm service scenario took {time.monotonic() - t0:.0f} s: {r.seen.get('phases')}", file=sys.stderr)
    return r


@pytest.mark.slow
def test_jobs_train_to_the_end_on_the_one_process_losses_one_across_two_nodes(run, reference_losses):
    assert {n: run.status(n) for n in run.ids} == {n: "finished" for n in run.ids}
    assert len(run.seen["across_hosts"]) == 2 and run.seen["across_plan"]["dp"] == 2, run.seen
    subs = [Submission(0, s) for s in (ACROSS, MOVER, ON_CPU, LATE, ON_NEW)]
    dev = loss_deviation(str(run.tmp / "state.db"), str(run.tmp / "work"), subs, run.ids, reference_losses)
    assert max(dev.values()) <= LOSS_TOL, dev
    with run.store() as st:
        assert st.check() == []
        for jid in run.ids.values():          # every resumed launch from the last checkpoint: nothing lost
            for launch, start, saved in resumes(str(run.tmp / "work"), jid, st):
                assert start == saved, f"job {jid} launch {launch} resumed at {start}, last checkpoint {saved}"


@pytest.mark.slow
def test_a_restart_takes_over_the_running_slurm_jobs(run):
    before, after, slurm_before, slurm_after = run.seen["restart"]
    assert after == before, (before, after)                          # no launch, the same Slurm jobs
    assert set(slurm_after) == set(slurm_before) and len(slurm_before) == 3, (slurm_before, slurm_after)
    assert all(v > 0 for v in run.seen["trained_while_down"].values()), run.seen["trained_while_down"]
    launches = run.launches("across")
    assert len(launches) == 1                                        # never relaunched
    steps = [x["step"] for x in read_results(launches[0].pid_info["run_dir"])]
    assert steps == list(range(1, STEPS + 1))                        # every step once: none lost or redone


@pytest.mark.slow
def test_a_slurm_drain_moves_the_job_off_within_two_rounds_and_resume_gives_the_node_back(run):
    seen = run.seen
    assert seen["moved_to"] != [seen["drained_host"]]
    assert 1 <= len(seen["rounds_to_move"]) <= 2, seen["rounds_to_move"]       # (rounds every 2 s)
    assert seen["drain_to_move_s"] < 60, seen["drain_to_move_s"]
    assert seen["late_hosts"] == [seen["drained_host"]]             # the only free GPU node: the one given back
    assert seen["nodes_vs_sinfo_start"] is None and seen["nodes_vs_sinfo_drained"] is None
    line = next(ln for ln in seen["nodes_text_drained"].splitlines() if f" {seen['drained_host']} " in ln)
    assert re.search(r"drain(ed|ing) .*out \(Slurm, last round\): drain(ed|ing) \(arena-test\)", line), line


@pytest.mark.slow
def test_a_node_the_partition_gains_is_taken_in_by_a_restart_in_place(run):
    pid, pid_after, alive, before, after, slurm_after, log = run.seen["gain"]
    assert pid_after == pid and alive                                # the same process, executed again
    assert after == before, (before, after)               # per job: no launch added, the same Slurm job
    ours = {slurm_id for _, slurm_id in before.values()}
    assert slurm_after and set(slurm_after) <= ours, (before, slurm_after)   # Slurm runs no other job of ours
    assert ("the Slurm partition gained nodes n7 (h100-sxm x1): restarting in place to take them in; running "
            "jobs are re-adopted") in log, log
    assert log.count("nothing relaunched") >= len(slurm_after) and "running jobs were checkpointed" not in log, log
    assert run.seen["on_new_hosts"] == ["n7"]
    # (no step lost or trained twice: test_jobs_train_to_the_end_... checks every resume, and
    # test_a_restart_takes_over_... that the job across two nodes ran every step once in one launch)


def test_a_restart_for_new_nodes_only_for_nodes_in_two_readings_in_a_row_and_not_too_often():
    """The decision alone (``new_nodes_restart``): which readings restart the service."""
    from engine.service.slurm_nodes import RESTART_GAP_S, new_nodes_restart
    assert new_nodes_restart((), ("n7",), True, None, 1e6) == ()              # seen once: not yet
    assert new_nodes_restart(("n7",), ("n7",), True, None, 1e6) == ("n7",)    # twice in a row
    assert new_nodes_restart(("n7",), (), True, None, 1e6) == ()              # gone again (flapping)
    assert new_nodes_restart(("n7",), ("n7", "n8"), True, None, 1e6) == ("n7",)   # n8 waits for a second look
    assert new_nodes_restart(("n7",), ("n7",), False, None, 1e6) == ()        # a known node missing: ids would move
    t = 1e6
    assert new_nodes_restart(("n7",), ("n7",), True, t, t + RESTART_GAP_S - 1) == ()   # restarted lately
    assert new_nodes_restart(("n7",), ("n7",), True, t, t + RESTART_GAP_S) == ("n7",)


@pytest.mark.slow
def test_an_outside_scancel_resumes_from_the_checkpoint(run):
    reason = run.seen["cancel_reason"]
    assert f"Slurm job {run.seen['cancelled']} ended CANCELLED" in reason, reason
    assert [(node, job) for node, job, _ in run.seen["node_failures"]] == [(4, run.ids["on-cpu"])]   # n5
    # (resumed at its last checkpoint: test_jobs_train_to_the_end_... checks every resume)


@pytest.mark.slow
def test_the_controller_down_mid_run_holds_the_rounds_and_stops_no_job(run):
    before, after, log = run.seen["controller_back"]
    assert after == before, (before, after)              # no job stopped, moved or relaunched meanwhile
    assert "rounds wait until it answers (launches run on)" in log and "must leave node" not in log, log
    assert "Slurm's state could not be read now: the Slurm controller does not answer" in \
        run.seen["nodes_text_down"], run.seen["nodes_text_down"]
    assert run.seen["health_down"]["ok"] is True


@pytest.mark.slow
def test_a_node_gone_from_the_partition_is_out_of_service_until_back(run):
    assert run.seen["gone"] == "no longer in Slurm partition 'arena'", run.seen["gone"]
    assert "Traceback" not in run.log()
    assert run.seen["exit"] == 0


def test_bad_slurm_inputs_at_start(cluster, tmp_path, monkeypatch, capsys):
    """Each one clear ``arena: error:`` line and exit status 2, before anything starts
    (``arena serve`` called in this process: each case ends in discovery)."""
    from engine.cli.main import main
    base = ["serve", "--slurm", "--db", str(tmp_path / "s.db"), "--work-dir", str(tmp_path / "w"), "--port",
            str(free_port())]
    dead = tmp_path / "dead.conf"             # a controller port nobody listens on (clients give up in ~1 s)
    dead.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", cluster.conf.read_text()) + "MessageTimeout=1\n")
    conf = ["--slurm-conf", str(cluster.conf)]
    cases = [
        ("unknown partition", conf + ["--partition", "gpus"],
         re.escape("arena: error: field '--partition': unknown Slurm partition 'gpus'; partitions: arena, odd, "
                   "spare")),
        ("GRES type missing", conf + ["--partition", "odd"],
         re.escape("arena: error: field '--slurm-gpu-types': node n6: Slurm GRES gpu:xpu9 is not in the GRES type "
                   "table; map it to a catalog GPU type in a JSON file given with --slurm-gpu-types FILE, e.g. "
                   "{\"xpu9\": \"a100-80gb\"} (catalog types: ")),
        ("controller down", ["--slurm-conf", str(dead)],
         r"arena: error: field '--slurm': the Slurm controller does not answer \(`scontrol ping`: "
         r"Slurmctld\(primary\) at \S+ is DOWN\); start slurmctld or point SLURM_CONF at the cluster's slurm.conf"),
        ("no Slurm commands", conf + ["PATH"],
         re.escape("arena: error: field '--slurm': no Slurm command 'scontrol' on PATH: run on a host with Slurm's "
                   "client commands")),
    ]
    for what, extra, want in cases:
        if extra[-1] == "PATH":
            extra = extra[:-1]
            monkeypatch.setenv("PATH", str(tmp_path))
        assert main(base + extra) == 2, what
        err = capsys.readouterr().err
        assert re.match(want, err) and len(err.splitlines()) == 1, (what, err)
    monkeypatch.undo()
    for argv, want in ((["--local-slots", "1", "--partition", "arena"], "field '--partition': --partition goes with "
                                                                       "--slurm"),
                       (["--slurm", "--local-slots", "1"], "field '--cluster': give exactly one of --cluster FILE, "
                                                           "--local-slots N and --slurm"),
                       (["--slurm", "--local-nodes", "2"], "field '--local-nodes': --local-nodes goes with "
                                                           "--local-slots")):
        assert main(["serve", *argv, "--db", str(tmp_path / "s.db"), "--work-dir", str(tmp_path / "w")]) == 2
        assert capsys.readouterr().err == f"arena: error: {want}\n"
    # the GRES type mapped with --slurm-gpu-types: the partition is read
    from engine.service.slurm_nodes import SlurmSettings, SlurmSetup
    table = tmp_path / "types.json"
    table.write_text('{"xpu9": "h100-sxm"}')
    setup = SlurmSetup.discover(SlurmSettings(partition="odd", gpu_types=str(table), conf=str(cluster.conf)))
    assert [(g.gpu_type, g.hosts) for g in setup.cluster.groups] == [("h100-sxm", ("n6",))]


def test_a_node_unknown_after_a_controller_restart_keeps_its_last_verdict():
    """A restarted controller shows every node UNKNOWN until its slurmd registers again
    (seen in this module's run, depending on timing): not a reason to take nodes out of
    service (their jobs would be stopped); a node UNKNOWN at start, or drained/down, is out."""
    from dataclasses import replace

    from engine.service.slurm_nodes import SlurmReading, reading_against
    from instances.slurm import SlurmView, load_gpu_type_table, nodes_from_sinfo_json
    text = (Path(__file__).parent / "data" / "slurm" / "sinfo.json").read_text()
    start = SlurmView("arena", tuple(nodes_from_sinfo_json(text, load_gpu_type_table())), "sinfo --json")
    spec = start.spec()
    n1, n2, n3 = start.nodes
    unknown = SlurmView("arena", (replace(n1, state="UNKNOWN", flags=("NOT_RESPONDING",), gpus_alloc=0),
                                  replace(n2, state="UNKNOWN"), replace(n3, state="UNKNOWN", flags=("DRAIN",))),
                        "sinfo --json")
    before = SlurmReading(0.0, view=start, out_of_service={1: "drained (disk)"})
    got = reading_against(spec, unknown, {}, {}, before)["out_of_service"]
    assert got == {1: "drained (disk)", 2: "unknown, drained (maint x)"}, got
    assert set(reading_against(spec, unknown, {}, {})["out_of_service"]) == {0, 1, 2}   # at start: out


def test_a_job_whose_batch_job_slurm_holds_pending_shows_pending_and_the_page_names_hosts_and_states(
        cluster, tmp_path, capsys):
    """A launch the store calls started while Slurm has not started its batch job (here
    held: PENDING, JobHeldUser; in the issue, behind a node still COMPLETING) shows
    ``pending``, with Slurm's state and reason, in the API, `arena status` and the page;
    the page's node grid names each node's Slurm host and state. Real Slurm, a real store,
    the real API in a real browser (no service runs: the job is the store's)."""
    from engine.cli.main import main as cli_main
    from engine.service.api import ApiContext, create_app
    from engine.service.jobspec import JobSpec
    from engine.service.slurm_nodes import SlurmNodeState, SlurmSettings, SlurmSetup
    from tests.browser import status_page
    from tests.test_service_views import serving
    setup = SlurmSetup.discover(SlurmSettings(conf=str(cluster.conf)))
    state = SlurmNodeState(setup, lambda m: None)
    held = int(cluster.run("sbatch", "--parsable", "--hold", "-p", "arena", "-J", "outside-held",
                           "--wrap", "sleep 300").stdout.strip().split(";")[0])
    try:
        db, work = tmp_path / "state.db", tmp_path / "work"
        with Store(db) as st:
            jid = st.jobs.submit(JobSpec("waits", "tiny-gpt__2L", 8, 10))
            gen = st.launches.record_intent(jid, {"dp": 1, "tp": 1, "pp": 1, "gpu_type": GPU, "nodes": 1,
                                                  "gpus_per_node": 1}, ["0:0"])
            st.launches.mark(jid, gen, "started", pid_info={"slurm_job_id": held, "run_dir": str(work / "x")})
            st.jobs.set_status(jid, "running", "launch 1")
        app = create_app(ApiContext(str(db), str(work), setup.cluster, "fcfs", slurm_nodes=state.peek,
                                    slurm_jobs=state.jobs))
        with serving(app) as port:
            url = f"http://127.0.0.1:{port}"
            job = Client(url).get(f"/api/jobs/{jid}")
            assert (job["status"], job["state"]) == ("running", "pending"), job
            assert job["slurm"] == {"job_id": held, "state": "PENDING", "reason": "JobHeldUser"}
            assert cli_main(["status", str(jid), "--url", url]) == 0
            out = capsys.readouterr().out
            assert " pending " in out.splitlines()[1] and f"Slurm: batch job {held} PENDING (JobHeldUser)" in out
            nodes = Client(url).get("/api/cluster")["nodes"]
            with status_page(url) as page:
                status = page.locator(f"#jobs tbody tr[data-job='{jid}'] td.status").inner_text()
                assert status.startswith("pending") and f"batch job {held} PENDING (JobHeldUser)" in status
                for n in nodes:
                    label = page.locator(f"#cluster .node[data-node='{n['node']}']").inner_text()
                    assert f"node {n['node']} {n['host']} (" in label and f"Slurm: {n['slurm']['state']}" in label
    finally:
        cluster.run("scancel", str(held), check=False)


def test_the_local_test_cluster_script_starts_a_cluster_and_stops_it_at_ctrl_c():
    """docs/slurm.md's one command for a cluster to try the service on: it prints the
    SLURM_CONF and the serve command once every node is idle, and Ctrl-C (SIGINT) stops
    every daemon and removes its folder."""
    import os
    import signal
    import subprocess
    why = unavailable()
    if why:
        pytest.skip(why)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, str(root / "scripts" / "slurm_test_cluster.py"), "--gpu-nodes", "1",
                             "--gpus", "1", "--cpu-nodes", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(ln.startswith("Ctrl-C") for ln in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
        text = "\n".join(lines)
        assert lines and lines[0].startswith("cluster ready: "), text
        conf = next(ln.split("=", 1)[1] for ln in lines if ln.startswith("export SLURM_CONF="))
        assert f"arena serve --slurm --slurm-conf {conf} " in text
        sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env={**os.environ, "SLURM_CONF": conf},
                               capture_output=True, text=True, timeout=30)
        assert sorted(sinfo.stdout.split()) == sorted(["n1", "idle", "n2", "idle"]), sinfo.stdout
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.strip().endswith("cluster stopped"), out
        assert not Path(conf).parent.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
