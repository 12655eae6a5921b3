"""One service per state (engine/service/lock.py): a second ``arena serve`` on the same
database or the same work folder is refused, naming the first one's PID and host, before
it touches anything; the lock dies with its holder (``kill -9`` leaves nothing stale).
With real services: tests/test_service_moves_restart.py (one run for both, to spare CI).
And ``arena serve`` without the ``service`` extra says which extra to install."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.service.lock import ServiceLock, db_lock_path, work_lock_path
from engine.service.store import Store
from instances.errors import InputError

REPO = str(Path(__file__).resolve().parents[1])
HOST = socket.gethostname()


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}


def _holder(db: Path, work: Path) -> subprocess.Popen:
    """Another process that takes the lock and keeps it until killed."""
    code = ("import sys, time; from engine.service.lock import ServiceLock; "
            "ServiceLock.acquire(sys.argv[1], sys.argv[2]); print('locked', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, str(db), str(work)], stdout=subprocess.PIPE, text=True,
                         env=_env())
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def test_the_lock_names_its_holder_covers_the_database_and_the_work_folder_apart_and_dies_with_it(tmp_path):
    db, work, other_work = tmp_path / "state.db", tmp_path / "work", tmp_path / "work2"
    work.mkdir()
    other_work.mkdir()
    holder = _holder(db, work)
    try:
        with pytest.raises(InputError) as e:                   # the same database, another work folder
            ServiceLock.acquire(tmp_path / "state.db", other_work)
        assert e.value.field == "--db" and e.value.file == str(db)
        assert f"is in use by arena serve PID {holder.pid} on host {HOST} since " in str(e.value)
        with pytest.raises(InputError) as e:                   # another database, the same work folder
            ServiceLock.acquire(tmp_path / "other.db", work)
        assert e.value.field == "--work-dir" and f"PID {holder.pid}" in str(e.value)
        # (a database named through a symbolic link is the same database)
        (tmp_path / "link.db").symlink_to(db)
        with pytest.raises(InputError, match="--db"):
            ServiceLock.acquire(tmp_path / "link.db", other_work)
        # refused, the other database's lock was given back at once
        mine = ServiceLock.acquire(tmp_path / "other.db", other_work)
        mine.release()
    finally:
        holder.kill()                                          # SIGKILL: no cleanup of its own
        holder.wait(10)
    t0 = time.monotonic()
    lock = ServiceLock.acquire(db, work)                        # at once: the kernel released it
    assert time.monotonic() - t0 < 1.0 and lock.held
    assert str(os.getpid()) in db_lock_path(db).read_text() and str(os.getpid()) in work_lock_path(work).read_text()
    lock.release()
    assert not lock.held
    ServiceLock.acquire(db, work).release()                     # released in this process too


def test_a_file_system_that_refuses_locks_is_named(tmp_path, monkeypatch):
    import errno

    import engine.service.lock as lock_mod

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(lock_mod.fcntl, "flock", no_locks)
    with pytest.raises(InputError) as e:
        ServiceLock.acquire(tmp_path / "state.db", tmp_path)
    assert e.value.field == "--db" and "cannot take the service lock" in str(e.value)
    assert "this file system refuses locks" in str(e.value) and os.strerror(errno.ENOLCK) in str(e.value)


def test_a_service_on_a_locked_state_is_refused_before_it_touches_anything(tmp_path):
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from instances.cluster import ClusterSpec, NodeGroup
    db, work = tmp_path / "state.db", tmp_path / "work"
    cluster = ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2")
    first = Service(cluster, make_policy("fcfs"), None, ReconfigCostModel(),
                    ServiceConfig(db_path=str(db), work_dir=str(work)), log=lambda m: None)
    try:
        (tmp_path / "w2").mkdir()
        with pytest.raises(InputError, match=f"PID {os.getpid()} on host"):
            Service(cluster, make_policy("fcfs"), None, ReconfigCostModel(),
                    ServiceConfig(db_path=str(tmp_path / "other.db"), work_dir=str(work)), log=lambda m: None)
        assert not (tmp_path / "other.db").exists()             # no database made, no round recorded
    finally:
        first.shutdown()
    second = Service(cluster, make_policy("fcfs"), None, ReconfigCostModel(),    # the first stopped: free
                     ServiceConfig(db_path=str(db), work_dir=str(work)), log=lambda m: None)
    second.shutdown()


def test_the_lock_is_not_inherited_by_the_processes_the_service_starts(tmp_path):
    """mpiexec outlives a killed service: had it inherited the lock's file, the lock would
    outlive the service too."""
    (tmp_path / "work").mkdir()
    lock = ServiceLock.acquire(tmp_path / "state.db", tmp_path / "work")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], close_fds=False,
                             start_new_session=True)
    try:
        lock.release()
        ServiceLock.acquire(tmp_path / "state.db", tmp_path / "work").release()
    finally:
        child.kill()
        child.wait(10)


BLOCK = "import sys; sys.modules['{mod}'] = None; from engine.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("mod", ["uvicorn", "fastapi"])
def test_serve_without_the_service_extra_says_which_extra_to_install_and_the_clients_need_none(tmp_path, mod):
    def arena(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", BLOCK.format(mod=mod), *argv], capture_output=True, text=True,
                              cwd=tmp_path, env=_env(), timeout=120)
    r = arena("serve", "--local-slots", "1")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"arena: error: arena serve needs the 'service' extra (FastAPI and uvicorn; no module "
                                f"named '{mod}'): pip install -e '.[service]'")
    assert not (tmp_path / ".arena").exists()                     # refused before anything was made
    # the clients talk HTTP with the standard library, and the database commands read SQLite
    r = arena("jobs", "--url", "http://127.0.0.1:9")
    assert r.returncode == 2 and "no service answers" in r.stderr and "Traceback" not in r.stderr, r.stderr
    Store(tmp_path / "state.db").close()
    r = arena("backup", "--db", "state.db", "--out", "copy.db")
    assert r.returncode == 0 and (tmp_path / "copy.db").is_file(), r.stderr


def test_export_trace_does_not_write_over_the_state_database(tmp_path, capsys):
    from engine.cli.main import main as cli_main
    from engine.service.jobspec import JobSpec
    db = tmp_path / "state.db"
    with Store(db) as st:
        st.jobs.submit(JobSpec("j", "tiny-gpt__2L", 8, 20))
    (tmp_path / "link.db").symlink_to(db)
    before = db.read_bytes()
    for out in (db, tmp_path / "link.db"):
        assert cli_main(["export-trace", "--db", str(db), "--out", str(out)]) == 2
        assert (f"field '--out': is the state database {db} or one of its files; writing it would destroy the "
                "service's state") in capsys.readouterr().err
    assert db.read_bytes() == before
