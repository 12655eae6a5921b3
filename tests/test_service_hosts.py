"""``arena serve`` off Slurm on the test hosts (``tests/hosts.py``: four network namespaces on
a bridge, each with its own address, host name and sshd), with a cluster JSON whose node
group names them as ``hosts``: the service runs here (the bridge's address), Hydra's
``mpiexec`` starts every launch's ranks on their hosts over ssh, and the ranks' process
groups meet at the hosts' addresses (gloo over the bridge).

One service run (the ``fcfs`` policy, so that each job runs on the shape it asks for) goes
through every scenario in turn:

- two jobs start: ``across``, data-parallel over two hosts, and ``solo`` on a third; their
  ranks run on their hosts (each rank's host name), and every TCP socket they hold is on
  their host's address (none on 127.0.0.1);
- the service is SIGKILLed mid-run and started again: it takes the two launches over on
  every host (the same mpiexec, no new launch; they trained on while it was down);
- ``arena drain`` of ``solo``'s node: it moves device to device to the free fourth host (a
  relocation: new ranks there receive the state over the network; nothing is read from
  a checkpoint), then the node is returned;
- the fourth host's link is taken down while ``solo`` trains there: within
  ``--host-down-after`` the host is out of service (``arena nodes`` says why), the job
  moves through storage to a free host from its last checkpoint, and once the link is
  back the host is in service again.

Every job trains to the end on the one-process losses (``LOSS_TOL``); the taken-over
launches without a step trained twice; ``solo`` loses at most one checkpoint interval.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from engine.service.scenario import LOSS_TOL, Submission, loss_deviation
from launcher.launch import rank_pids, read_events, read_results
from tests.service_run import ServiceRun
from tests.test_engine_helpers import wait_until

pytestmark = pytest.mark.slow

JOB = {"model": "tiny-gpt__2L", "global_batch": 8, "gpu_type": "cpu"}
ACROSS = {"name": "across", **JOB, "steps": 45, "gpus": 2}      # dp=2, one rank on each of two hosts
SOLO = {"name": "solo", **JOB, "steps": 90, "gpus": 1}          # drained off, then its host cut off
STEP_DELAY_S = 0.3
CHECKPOINT_S = 1.0
DOWN_AFTER_S = 3.0


def wait_for(pred, what: str, timeout_s: float = 90.0, poll_s: float = 0.2):
    return wait_until(pred, timeout_s, what, poll_s)


class Run(ServiceRun):
    """The service run and what the scenario saw, for the tests below."""

    def __init__(self, hosts, tmp: Path):
        super().__init__(tmp)
        self.hosts = hosts
        cluster = {"name": "test-hosts", "node_groups": [{"gpu_type": "cpu", "num_nodes": len(hosts.hosts),
                                                           "gpus_per_node": 1,
                                                           "hosts": [h.addr for h in hosts.hosts]}]}
        (tmp / "cluster.json").write_text(json.dumps(cluster))

    def args(self) -> list[str]:
        t = self.tmp
        return ["--cluster", str(t / "cluster.json"), "--policy", "fcfs", "--db", str(t / "state.db"),
                "--work-dir", str(t / "work"), "--port", str(self.port), "--round-interval", "2",
                "--checkpoint-interval", str(CHECKPOINT_S), "--step-delay", str(STEP_DELAY_S),
                "--failure-backoff", "0", "--stop-timeout", "10", "--launch-stall-after", "60",
                "--host-check-interval", "1", "--host-down-after", str(DOWN_AFTER_S), "--stop-after", "400"]

    # --- reading -----------------------------------------------------------------------------
    def running(self, name: str):
        ls = self.launches(name)
        return ls[-1] if ls and ls[-1].state == "started" else None

    def nodes(self, launch) -> list[int]:
        return sorted({int(g.split(":")[0]) for g in launch.gpus})

    def history(self, name: str) -> list[str]:
        return [h["reason"] for h in self.client.get(f"/api/jobs/{self.ids[name]}")["history"]]

    def sockets(self, host) -> list[tuple[str, str]]:
        """(local, peer) address of every TCP socket a training rank holds on ``host``."""
        out = subprocess.run(["nsenter", f"--net=/run/netns/{host.netns}", "ss", "-Htanp"], capture_output=True,
                             text=True, timeout=20).stdout
        rows = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 6 and "python" in line:
                rows.append((parts[3].rsplit(":", 1)[0], parts[4].rsplit(":", 1)[0]))
        return rows


def scenario(r: Run) -> None:
    seen, t0 = r.seen, time.monotonic()
    phase = lambda what: seen.setdefault("phases", []).append((what, round(time.monotonic() - t0)))  # noqa: E731
    h = r.hosts.hosts
    r.start()
    r.submit(ACROSS)
    r.submit(SOLO)
    wait_for(lambda: all(r.running(n) and r.steps(n) >= 2 for n in ("across", "solo")), "both jobs training", 150)
    phase("two jobs training on three hosts")
    run_dirs = {n: Path(r.running(n).pid_info["run_dir"]) for n in ("across", "solo")}
    seen["nodes_at_start"] = {n: r.nodes(r.running(n)) for n in ("across", "solo")}
    seen["rank_hosts"] = {n: sorted(host for _, host in rank_pids(d).values()) for n, d in run_dirs.items()}
    seen["sockets"] = {x.addr: r.sockets(x) for x in h}

    # --- kill -9 and restart: the launches are taken over on every host --------------------------
    before = {n: (len(r.launches(n)), r.running(n).pid_info["pid"]) for n in ("across", "solo")}
    r.sp.kill()
    at_kill = {n: r.steps(n) for n in ("across", "solo")}
    r.start()
    wait_for(lambda: r.log().count("nothing relaunched") >= 2, "the restarted service took the two launches over")
    wait_for(lambda: all(r.steps(n) > at_kill[n] for n in ("across", "solo")), "both jobs training on")
    phase("restarted, both taken over")
    seen["restart"] = (before, {n: (len(r.launches(n)), r.running(n).pid_info["pid"]) for n in ("across", "solo")})

    # --- drain solo's node: it moves device to device to the free host ----------------------------
    src = r.nodes(r.running("solo"))[0]
    r.client.post(f"/api/nodes/{src}/drain", {"reason": "test"})
    wait_for(lambda: (x := r.running("solo")) and r.nodes(x) != [src] and r.steps("solo") > r.steps("solo") - 1
             and x.generation > 1, "solo moved off the drained node")
    moved = r.running("solo")
    wait_for(lambda: any(e.get("event") == "moved" for e in read_events(moved.pid_info["run_dir"]))
             and len(read_results(moved.pid_info["run_dir"])) > 0, "solo's move recorded")
    seen["drain_move"] = {"to": r.nodes(moved), "history": r.history("solo"),
                          "moved": [e for e in read_events(moved.pid_info["run_dir"]) if e["event"] == "moved"]}
    r.client.post(f"/api/nodes/{src}/undrain", {})
    phase("solo moved device to device")

    # --- cut solo's host off: it moves through storage, the host is out until it is back -----------
    at = r.steps("solo")
    wait_for(lambda: r.steps("solo") >= at + 3, "solo training on its new host")
    cut_node = r.nodes(r.running("solo"))[0]
    host = h[cut_node]
    launches_before = len(r.launches("solo"))
    t_cut = time.monotonic()
    r.hosts.cut(host)
    try:
        wait_for(lambda: f"host {host.addr} unreachable" in r.arena_nodes(), "the cut host out of service", 30)
        seen["out_after_s"] = time.monotonic() - t_cut
        seen["nodes_out"] = r.arena_nodes()
        wait_for(lambda: len(r.launches("solo")) > launches_before and (x := r.running("solo"))
                 and cut_node not in r.nodes(x), "solo relaunched elsewhere", 90)
        at_relaunch = r.steps("solo")
        wait_for(lambda: r.steps("solo") > at_relaunch, "solo training elsewhere")
        seen["trains_again_after_s"] = time.monotonic() - t_cut
        seen["solo_after_cut"] = r.nodes(r.running("solo"))
    finally:
        r.hosts.restore(host)
    wait_for(lambda: f"host {host.addr} unreachable" not in r.arena_nodes(), "the host back in service", 30)
    seen["nodes_back"] = r.arena_nodes()
    phase("host cut off and back")

    wait_for(lambda: all(r.status(n) == "finished" for n in ("across", "solo")), "both jobs finished", 200)
    phase("both finished")


@pytest.fixture(scope="module")
def run(test_hosts, tmp_path_factory, reference_losses):
    tmp = tmp_path_factory.mktemp("hosts")
    r = Run(test_hosts, tmp)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in test_hosts.launch_env().items():
            mp.setenv(k, v)                     # (the service and its mpiexec: Hydra's ssh to the hosts)
        try:
            scenario(r)
            r.seen["losses"] = loss_deviation(str(tmp / "state.db"), str(tmp / "work"),
                                              [Submission(0, ACROSS), Submission(0, SOLO)], r.ids, reference_losses)
            r.seen["error"] = None
        except (AssertionError, TimeoutError, RuntimeError) as e:
            r.seen["error"] = f"{e}\n--- serve.log tail\n{r.log()[-6000:]}\n--- hosts\n{test_hosts.log_tails()}"
        finally:
            if r.sp is not None:
                r.sp.terminate(60)
    yield r


def ok(run: Run) -> dict:
    assert run.seen.get("error") is None, run.seen.get("error")
    return run.seen


def test_jobs_train_across_hosts_on_the_one_process_losses(run):
    seen = ok(run)
    assert len(seen["nodes_at_start"]["across"]) == 2
    names = {x.hostname for x in run.hosts.hosts}
    assert len(set(seen["rank_hosts"]["across"])) == 2 and set(seen["rank_hosts"]["across"]) <= names
    for name, dev in seen["losses"].items():
        assert dev <= LOSS_TOL, (name, dev)


def test_ranks_bind_and_connect_on_their_hosts_addresses_never_loopback(run):
    seen = ok(run)
    socks = seen["sockets"]
    assert sum(map(len, socks.values())) > 0
    for addr, rows in socks.items():
        for local, _ in rows:
            assert local in (addr, "*", "0.0.0.0", "[::]", "[::ffff:" + addr + "]"), (addr, rows)
        assert not any("127.0.0.1" in a or "127.0.0.1" in b for a, b in rows), (addr, rows)


def test_a_restart_takes_the_launches_over_on_every_host(run):
    seen = ok(run)
    before, after = seen["restart"]
    assert before == after                      # same launches, same mpiexec
    for name in ("across", "solo"):
        with run.store() as st:
            got = {}
            for lch in st.launches.rows(run.ids[name]):
                for rec in read_results((lch.pid_info or {}).get("run_dir", "")):
                    got.setdefault(rec["step"], []).append(lch.generation)
        assert sorted(got) == list(range(1, (ACROSS if name == "across" else SOLO)["steps"] + 1))


def test_a_drained_node_s_job_moves_device_to_device_to_another_host(run):
    seen = ok(run)
    mv = seen["drain_move"]
    assert mv["to"] != seen["nodes_at_start"]["solo"]
    assert any("moved device to device" in h for h in mv["history"]), mv["history"]
    ev = mv["moved"][-1]
    assert ev["relocated"] and ev["bytes_moved"] > 0


def test_a_host_cut_off_is_out_of_service_and_its_job_trains_again_elsewhere(run):
    seen = ok(run)
    assert seen["out_after_s"] < DOWN_AFTER_S + 10
    assert "unreachable" in seen["nodes_out"]
    assert "unreachable" not in seen["nodes_back"]
    with run.store() as st:
        from engine.service.scenario import resumes
        res = resumes(str(run.tmp / "work"), run.ids["solo"], st)
    assert res and all(start == saved for _, start, saved in res), res
