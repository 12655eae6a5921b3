"""One service per state: ``arena serve`` holds an exclusive lock on its state database
and on its work folder for as long as it runs.

Two services on one state would each take the other's jobs for a dead service's: the
second's recovery stops the first's ranks and relaunches them, and the first dies on its
next write (``StaleGeneration``); with no jobs both would record rounds in one database.
So a service takes two locks before it touches anything (no rank stopped, no round
recorded): ``<db>.serve-lock`` beside the database and ``.serve-lock`` in the work folder
(they can be given apart; a second service sharing either is refused). Each is an OS
lock (``flock``) on that file: the kernel releases it when the process ends, however it
ends, so a ``kill -9`` leaves nothing stale and a new service starts at once. The holder
writes its PID, host and start time into the file, which the refusal names. The files
stay behind when the service stops; only the lock on them means anything.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from instances.errors import InputError

DB_LOCK_SUFFIX = ".serve-lock"       # <db>.serve-lock, beside the database
WORK_LOCK_NAME = ".serve-lock"       # <work>/.serve-lock


def db_lock_path(db_path: str | Path) -> Path:
    p = Path(db_path).resolve()      # (a symbolic link to the database locks the same file)
    return p.with_name(p.name + DB_LOCK_SUFFIX)


def work_lock_path(work_dir: str | Path) -> Path:
    return Path(work_dir).resolve() / WORK_LOCK_NAME


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"arena serve PID {int(info['pid'])} on host {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another arena serve (it has not written its PID yet)"


class ServiceLock:
    """The two locks of one service; ``acquire`` takes both or neither."""

    def __init__(self, fds: list[int], paths: list[Path]):
        self._fds, self.paths = fds, paths

    @classmethod
    def acquire(cls, db_path: str | Path, work_dir: str | Path) -> "ServiceLock":
        """Lock the database, then the work folder (made once the database's lock is held:
        a service refused for a database in use makes nothing) for this process, or raise
        ``InputError`` naming the flag, the path and the holder."""
        fds: list[int] = []
        paths: list[Path] = []
        try:
            for state, lock, flag in ((Path(db_path), db_lock_path(db_path), "--db"),
                                      (Path(work_dir), work_lock_path(work_dir), "--work-dir")):
                if flag == "--work-dir":
                    _make_folder(state)
                fds.append(_take(state, lock, flag))
                paths.append(lock)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode()
        for fd in fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
            os.fsync(fd)
        return cls(fds, paths)

    def release(self) -> None:
        """Give the locks up (closing the files does); the process ending does too."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    @property
    def held(self) -> bool:
        return bool(self._fds)


def _make_folder(work: Path) -> None:
    try:
        work.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError("is a file, not a folder", file=str(work), field="--work-dir") from None
    except OSError as e:
        raise InputError(f"cannot be made: {e.strerror or e}", file=str(work), field="--work-dir") from None


def _take(state: Path, lock: Path, flag: str) -> int:
    try:
        # O_CLOEXEC: no child (mpiexec outlives a killed service) may keep the lock alive
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise InputError(f"cannot open the service lock {lock}: {e.strerror or e}", file=str(state),
                         field=flag) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        why = (f"is in use by {_holder(fd)} (its lock: {lock}); one service per state database and work folder: "
               "stop that one first, or give this one its own --db and --work-dir") if busy else \
            (f"cannot take the service lock {lock}: {e.strerror or e} (this file system refuses locks; "
             "see docs/service.md, \"One service per state\")")
        os.close(fd)
        raise InputError(why, file=str(state), field=flag) from None
    return fd
