"""Jobs across hosts: the launcher on the test hosts (``tests/hosts.py``: network namespaces
on a bridge, each with its own address, host name and sshd; Hydra's ``mpiexec`` starts the
ranks there over ssh, gloo runs over the bridge).

- the test hosts themselves: each answers ssh with its own name and address; a host cut off
  answers nothing until its link is back;
- a job data-parallel across two hosts moves to a third host: its new processes there
  fail before they are up (a fault hook), so the move goes through storage with nothing
  lost (a stop with a checkpoint; nothing had moved); the next move to a fourth host
  fails mid-transfer (a process killed), so the job resumes there from its last
  checkpoint; a fresh executor then takes the running launch over (as a restarted
  service does) and stops it with a checkpoint: every step trained is on the one-process
  losses, every step once after the last checkpoint of each fallback.

- on Slurm (``tests/slurm_cluster.py`` with one ``slurmd`` per test host, ``NodeAddr`` its
  address): a job data-parallel across two nodes runs on two hosts (Hydra's ``mpiexec``
  in the batch job starts its proxies with ``srun``), on the one-process losses.

The moves that succeed device to device between hosts, the restart and the host cut off
are in ``tests/test_service_hosts.py``.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from instances.allocation import Allocation
from instances.grid import Grid, Shape
from instances.jobs import Job
from launcher.config import ParallelPlan
from launcher.d2d import FAULT_ENV
from launcher.launch import read_events, read_results
from launcher.mpi_executor import MpiExecutor, MpiExecutorConfig
from launcher.reference import train_reference

MODEL = "tiny-gpt__2L"
STEPS = 1000                     # more than the test lets it train: it is stopped at the end
LOSS_TOL = 1e-4                  # as tests/test_launcher_mpi.py


def ssh(hosts, addr: str, cmd: str, timeout: float = 15) -> subprocess.CompletedProcess:
    return subprocess.run([str(hosts.ssh), addr, cmd], capture_output=True, text=True, timeout=timeout)


def test_each_test_host_has_its_own_name_and_address_and_a_cut_host_answers_nothing(test_hosts):
    for h in test_hosts.hosts:
        out = ssh(test_hosts, h.addr, "hostname; ip -4 -o addr show eth0")
        assert out.returncode == 0, out.stderr
        name, iface = out.stdout.splitlines()[:2]
        assert name == h.hostname and f"inet {h.addr}/" in iface
    h1, h2 = test_hosts.host(1), test_hosts.host(2)
    # host 1 reaches host 2 directly (over the bridge, not through this process)
    out = ssh(test_hosts, h1.addr, f"exec 3<>/dev/tcp/{h2.addr}/22 && head -c 7 <&3")
    assert out.stdout == "SSH-2.0", out.stderr
    test_hosts.cut(h2)
    try:
        with pytest.raises(subprocess.TimeoutExpired):          # (no answer: the connection waits)
            ssh(test_hosts, h2.addr, "true", timeout=1.5)
    finally:
        test_hosts.restore(h2)
    test_hosts.wait_ssh(20, [h2])


def on(*nodes: int) -> Allocation:
    """One rank on each of ``nodes`` (node i: test host i + 1)."""
    return Allocation(Grid(Shape("cpu", len(nodes), 1)), tuple((n, 0) for n in nodes))


def wait_for(pred, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def ready(ex: MpiExecutor) -> dict:
    """The current launch's ``ready`` event (its ranks up, the checkpoint loaded)."""
    return wait_for(lambda: next((e for e in read_events(ex.run_dir("j")) if e["event"] == "ready"), None),
                    "the relaunch's ranks ready")


@pytest.mark.slow
def test_moves_between_hosts_fall_back_to_storage_when_the_direct_path_fails_and_a_launch_is_taken_over(
        test_hosts, tmp_path, monkeypatch):
    for k, v in test_hosts.launch_env().items():
        monkeypatch.setenv(k, v)
    hosts = {i: h.addr for i, h in enumerate(test_hosts.hosts)}
    cfg = MpiExecutorConfig(work_dir=str(tmp_path), node_hosts=hosts, checkpoint_every=5, checkpoint_interval_s=0,
                            step_delay_s=0.1, stop_timeout_s=30, move_timeout_s=60)
    ex = MpiExecutor(cfg)
    job = Job("j", MODEL, 8, STEPS, 0.0)
    try:
        ex.launch(job, on(0, 1), ParallelPlan(dp=2), 0.0)
        run_dir = ex.run_dir("j")
        wait_for(lambda: ex.progress("j").iterations_done >= 3, "the job training on two hosts")
        hf = (tmp_path / "j" / "launch_0" / "hostfile").read_text().split()
        assert hf == [f"{hosts[0]}:1", f"{hosts[1]}:1"]

        # the new process on host 3 fails before it is up: nothing moved, a stop with a checkpoint
        monkeypatch.setenv(FAULT_ENV, "join:2")             # (joint position 2: after the two old ranks)
        ex.release("j", 0.0, target=on(2))
        assert ex.released_path("j") == "d2d"
        ex.reconfigure("j", on(2), ParallelPlan(dp=1), 0.0, launch_index=1)
        first = ex.move_records("j")[-1]
        assert first["path"] == "storage-fallback" and "before they were up" in first["reason"], first
        assert hosts[2] in first["reason"]
        saved = [e["step"] for e in read_events(run_dir) if e["event"] == "save" and e["why"] == "stop"]
        resumed = ready(ex)["start_step"]
        assert saved and resumed == saved[-1]              # nothing lost: it stopped with a checkpoint

        # the move to host 4 fails mid-transfer (its new process killed): resumed from the last checkpoint
        wait_for(lambda: ex.progress("j").iterations_done >= resumed + 7, "the job training on host 3")
        monkeypatch.setenv(FAULT_ENV, "1")                  # (joint position 1: the new process)
        ex.reconfigure("j", on(3), ParallelPlan(dp=1), 0.0, launch_index=2)
        second = ex.move_records("j")[-1]
        assert second["path"] == "storage-fallback" and "exited" in second["reason"], second
        ck = ready(ex)["start_step"]
        assert ck >= resumed + 5 and ck % 5 == 0
        monkeypatch.delenv(FAULT_ENV)

        # a fresh executor takes the running launch over (a restarted service): nothing relaunched
        wait_for(lambda: ex.progress("j").iterations_done >= ck + 2, "the job training on host 4")
        pid = ex.process("j").pid
        ex2 = MpiExecutor(cfg)
        p = ex2.adopt(job, on(3), ParallelPlan(dp=1), 2)
        assert p is not None and p.running and ex2.process("j").pid == pid
        at = p.iterations_done
        wait_for(lambda: ex2.progress("j").iterations_done >= at + 3, "the job training on, taken over")
        ex2.stop("j", 0.0)
        last = ex2.progress("j").last_checkpoint_iteration
        assert not ex2.progress("j").running and ex.process("j").poll() is not None
    finally:
        ex.close()
    got: dict[int, float] = {}
    for i in range(3):                                      # each launch's steps; a later one's replace
        got.update({r["step"]: r["loss"] for r in read_results(tmp_path / "j" / f"launch_{i}")})
    assert sorted(got) == list(range(1, int(last) + 1))
    ref = train_reference(MODEL, steps=int(last), global_batch=8, seed=0)
    assert max(abs(got[i + 1] - ref[i]) for i in range(int(last))) <= LOSS_TOL
    assert os.path.isfile(tmp_path / "j" / "launch_2" / "launcher.json")


@pytest.mark.slow
def test_a_job_spans_two_hosts_on_slurm(test_hosts, tmp_path):
    from instances.slurm import SlurmCommands, discover
    from launcher.slurm_executor import SlurmExecutor, SlurmExecutorConfig
    from tests.slurm_cluster import NodeDef, started_cluster
    from tests.slurm_cluster import unavailable as slurm_unavailable
    why = slurm_unavailable()
    if why:
        pytest.skip(why)
    steps = 12
    with started_cluster((NodeDef("n1", cpus=2), NodeDef("n2", cpus=2)), hosts=test_hosts) as cluster:
        v = discover(SlurmCommands(str(cluster.conf)))
        ex = SlurmExecutor(MpiExecutorConfig(work_dir=str(tmp_path), checkpoint_every=0, checkpoint_interval_s=0),
                           SlurmExecutorConfig(nodes=v.node_names(), gres=v.launch_gres(), conf=str(cluster.conf),
                                               tag="hosts", poll_s=0.5))
        job = Job("s", MODEL, 8, steps, 0.0)
        try:
            ex.launch(job, on(0, 1), ParallelPlan(dp=2), 0.0)
            ended = wait_for(lambda: ex.advance(ex.now_s() + 1), "the Slurm job finished", 180)
        finally:
            ex.close()
            cluster.cancel_all_jobs()
        assert ended[0].finished, (ended, cluster.log_tails())
    from launcher.launch import rank_pids
    run_dir = tmp_path / "s" / "launch_0"
    hosts = sorted(host for _, host in rank_pids(run_dir).values())
    assert hosts == sorted(h.hostname for h in test_hosts.hosts[:2])
    ref = train_reference(MODEL, steps=steps, global_batch=8, seed=0)
    got = {r["step"]: r["loss"] for r in read_results(run_dir)}
    assert sorted(got) == list(range(1, steps + 1))
    assert max(abs(got[i + 1] - ref[i]) for i in range(steps)) <= LOSS_TOL
