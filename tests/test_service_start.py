"""``arena serve`` refuses at start what would otherwise fail later, naming the option or
the file: a policy that cannot decide the service's jobs (it would stop the scheduler at
the first submission), a state database that is a pipe, one with a job it cannot read or
a table dropped (with how to restore it), a host that is no address, a data root that is
the whole file system; and nothing is made (no database, no work folder) when it refuses.
Real SQLite files and the real command line, in-process (no service runs: each refusal
comes before one would start)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.main import main as cli_main
from engine.service.jobspec import JobSpec
from engine.service.store import Store
from tests.test_service_lock import _env, _holder

RESTORE = 'restore it from a backup: stop the service and start it on a copy of the backup (docs/operators.md, ' \
          '"Back up and restore")'


def _serve(tmp: Path, *argv: str) -> list[str]:
    return ["serve", "--local-slots", "2", "--db", str(tmp / "s.db"), "--work-dir", str(tmp / "w"),
            "--port", "9", *argv]


def _refused(capsys, argv: list[str]) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("arena: error: ") and "Traceback" not in err, err
    return err.strip()


def test_a_policy_that_cannot_decide_the_services_jobs_is_refused_at_start(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    for flag in ("--policy", "--shadow-policy"):
        argv = [flag, "pollux"] + (["--policy", "fcfs"] if flag == "--shadow-policy" else [])
        err = _refused(capsys, _serve(tmp_path, *argv))
        # (the workload check, engine/core/policy.py's check_policy_for, refuses it first; a
        # policy that fails its trial round otherwise, engine/service/probe.py, is refused there)
        assert err.startswith(f"arena: error: field '{flag}': policy 'pollux' decides only the Sia artifact's "
                              "adaptive-batch goodput jobs"), err
        assert err.endswith("not the fixed-batch jobs of the live service"), err
    assert not (tmp_path / "w").exists() and not (tmp_path / "s.db").exists()


def test_a_plug_in_policy_that_fails_a_trial_round_is_refused_at_start(tmp_path, capsys, monkeypatch):
    # a plug-in policy that declares nothing about its jobs but cannot decide fixed-batch
    # ones: the trial round (engine/service/probe.py) refuses it before anything is made
    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    plugin = tmp_path / "only_goodput.py"
    plugin.write_text(
        "from engine.core.policy import Policy, register_policy\n"
        "from instances.errors import InputError\n\n\n"
        "@register_policy('goodput-only-plugin')\n"
        "class GoodputOnly(Policy):\n"
        "    name = 'goodput-only-plugin'\n\n"
        "    def decide(self, ctx):\n"
        "        raise InputError('decides goodput jobs only')\n")
    assert cli_main(["--plugin", str(plugin)] + _serve(tmp_path, "--policy", "goodput-only-plugin")) == 2
    lines = capsys.readouterr().err.strip().splitlines()          # the plug-in's load line, then the refusal
    assert lines[0].startswith("arena: plugin ") and len(lines) == 2 and "Traceback" not in lines[1]
    err = lines[1]
    assert err == ("arena: error: field '--policy': policy 'goodput-only-plugin' cannot decide this service's jobs "
                   "(fixed-batch torch jobs, as `arena submit` sends them): decides goodput jobs only"), err
    assert not (tmp_path / "w").exists() and not (tmp_path / "s.db").exists()


def test_a_database_that_is_a_pipe_is_refused_naming_it(tmp_path, capsys):
    fifo = tmp_path / "state.db"
    os.mkfifo(fifo)
    err = _refused(capsys, ["serve", "--local-slots", "2", "--db", str(fifo), "--work-dir", str(tmp_path / "w")])
    assert err == f"arena: error: {fifo}, field '--db': not a regular file (a pipe, a device or a socket): not a " \
                  "state database"
    assert not (tmp_path / "w").exists() and not (tmp_path / "state.db.serve-lock").exists()
    for cmd in (["backup", "--db", str(fifo), "--out", str(tmp_path / "b.db")],
                ["export-trace", "--db", str(fifo), "--out", str(tmp_path / "t.csv")]):
        assert "not a regular file (a pipe" in _refused(capsys, cmd)


def _damaged(tmp: Path, how: str) -> Path:
    db = tmp / f"{how}.db"
    with Store(db) as st:
        st.jobs.submit(JobSpec("a", "tiny-gpt__2L", 8, 20))
        st.jobs.submit(JobSpec("b", "tiny-gpt__2L", 8, 20))
    conn = sqlite3.connect(db)
    conn.execute({"spec": "UPDATE jobs SET spec = '{bad' WHERE id = 2",
                  "field": "UPDATE jobs SET spec = json_set(spec, '$.steps', -3) WHERE id = 2",
                  "table": "DROP TABLE moves",
                  "index": "DROP INDEX launch_gpus_one_active"}[how])
    conn.commit()
    conn.close()
    return db


@pytest.mark.parametrize("how, says", [
    ("spec", "job 2: its spec cannot be read (not JSON: Expecting property name enclosed in double quotes"),
    ("field", "job 2: its spec cannot be read (field 'steps': "),
    ("table", "it has no table 'moves', which its schema version"),
    ("index", "it has no index 'launch_gpus_one_active', which its schema version")])
def test_a_damaged_state_database_is_refused_at_start_naming_what_and_how_to_restore(tmp_path, capsys, how, says):
    db = _damaged(tmp_path, how)
    err = _refused(capsys, ["serve", "--local-slots", "2", "--db", str(db), "--work-dir", str(tmp_path / "w"),
                            "--port", "9"])
    assert err.startswith(f"arena: error: {db}, field ") and says in err and err.endswith(RESTORE), err
    # the commands that read the database name it too, rather than a traceback
    out = tmp_path / "t.csv"
    assert says in _refused(capsys, ["export-trace", "--db", str(db), "--out", str(out)]) and not out.exists()
    backup = tmp_path / f"{how}-backup.db"
    if how in ("spec", "field"):
        assert says in _refused(capsys, ["backup", "--db", str(db), "--out", str(backup)]) and not backup.exists()


def test_a_service_on_a_damaged_state_starts_nothing(tmp_path):
    """Through the Service itself (what arena serve builds): refused before the store is
    read by recovery or the API, the lock given back."""
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.lock import ServiceLock
    from instances.cluster import ClusterSpec, NodeGroup
    from instances.errors import InputError
    db, work = _damaged(tmp_path, "spec"), tmp_path / "w"
    with pytest.raises(InputError, match="its spec cannot be read"):
        Service(ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"), make_policy("fcfs"), None, ReconfigCostModel(),
                ServiceConfig(db_path=str(db), work_dir=str(work)), log=lambda m: None)
    ServiceLock.acquire(db, work).release()                  # given back


def test_a_host_that_is_no_address_of_this_machine_is_blamed_on_host_not_token(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    token = ["--token", "Zq8xL2mV9pR4tW7yB3nC"]
    for host, says in [("999.1.1.1", "'999.1.1.1' is not an address this machine can bind: it does not resolve"),
                       ("nosuch.invalid", "'nosuch.invalid' is not an address this machine can bind"),
                       ("192.0.2.1", "cannot bind 192.0.2.1:a free port: Cannot assign requested address (not an "
                                     "address of this machine)")]:     # (TEST-NET-1: never this machine's)
        for extra in ([], token):
            argv = _serve(tmp_path, "--host", host, *extra)
            argv[argv.index("--port") + 1] = "18999"
            err = _refused(capsys, argv)
            assert err.startswith("arena: error: field '--host': ") and says in err, err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("root, says", [("/", "/ is the whole file system"), ("/etc", "/etc is a system folder"),
                                        ("/proc/self", "lies in the system folder /proc"),
                                        ("/usr", "/usr is a system folder")])
def test_a_data_root_that_is_the_file_system_or_a_system_folder_is_refused(tmp_path, capsys, root, says):
    err = _refused(capsys, _serve(tmp_path, "--data-root", root))
    assert err.startswith("arena: error: field '--data-root': ") and says in err
    assert "every file in it would become submittable" in err and not (tmp_path / "w").exists()


def test_a_second_service_refused_for_a_database_in_use_makes_no_work_folder(tmp_path):
    db, work = tmp_path / "state.db", tmp_path / "work"
    work.mkdir()
    holder = _holder(db, work)
    try:
        other = tmp_path / "other-work"
        r = subprocess.run([sys.executable, "-m", "engine.cli", "serve", "--local-slots", "1", "--db", str(db),
                            "--work-dir", str(other), "--port", "9"], capture_output=True, text=True,
                           env=_env(), timeout=120, cwd=tmp_path)
        assert r.returncode == 2 and f"field '--db': is in use by arena serve PID {holder.pid}" in r.stderr, r.stderr
        assert not other.exists()
    finally:
        holder.kill()
        holder.wait(10)
