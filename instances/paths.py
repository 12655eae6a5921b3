"""Output paths checked before any work starts, so a bad ``--out`` or checkpoint folder
fails in the first second, not after a long run. The checks are real, not ``os.access``
(which says yes to root everywhere and to /proc): a uniquely named temporary file is
created in the folder, or for a folder still to be made in its nearest existing
ancestor, and removed at once (a refused run leaves nothing behind; the writer creates
the folder)."""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from .errors import InputError


def stat_path(p: Path, field: str) -> os.stat_result | None:
    """``p``'s status (symbolic links followed), None where nothing is there, or an
    ``InputError`` naming ``field`` for any other OS refusal (a name too long, a link loop)."""
    try:
        return p.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise InputError(f"cannot be used: {e.strerror or e}", file=str(p), field=field) from None


def _probe_write(p: Path, field: str) -> None:
    """Create and remove a temporary file in the folder ``p``: the only sure test that it
    takes files."""
    try:
        with tempfile.NamedTemporaryFile(dir=p, prefix=".arena-write-check-"):
            pass
    except OSError as e:
        raise InputError(f"directory is not writable: creating a file in it failed ({e.strerror or e})",
                         file=str(p), field=field) from None


def _check_new_names(p: Path, existing: Path, field: str) -> None:
    """The parts of ``p`` below its nearest existing folder ``existing`` (those still to be
    made) within the file system's limits on a name's length (``NAME_MAX``, 255 bytes on
    most) and on a whole path (``PATH_MAX``): a name too long was only found by the writer,
    after the run (and after it had made the folders above it)."""
    def limit(name: str, default: int) -> int:
        try:
            return os.pathconf(existing, name)
        except (OSError, ValueError):
            return default
    name_max, path_max = limit("PC_NAME_MAX", 255), limit("PC_PATH_MAX", 4096)
    for part in p.relative_to(existing).parts if p.is_relative_to(existing) else p.parts:
        if len(os.fsencode(part)) > name_max:
            raise InputError(f"cannot be created: the name {part[:40]!r}... is {len(os.fsencode(part)):,} bytes "
                             f"long, more than the {name_max} a name may have there", file=str(p), field=field)
    if len(os.fsencode(os.path.abspath(p))) >= path_max:
        raise InputError(f"cannot be created: the path is {len(os.fsencode(os.path.abspath(p))):,} bytes long, "
                         f"more than the {path_max - 1:,} a path may have", file=str(p), field=field)


def check_output_dir(path: str | os.PathLike, field: str) -> Path:
    """A folder we can write into: an existing directory that takes a file, or a path whose
    nearest existing ancestor does. Raises ``InputError`` naming ``field`` otherwise."""
    p = Path(path).expanduser()
    st = stat_path(p, field)
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise InputError("exists and is not a directory", file=str(p), field=field)
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError("directory is not writable", file=str(p), field=field)
        _probe_write(p, field)
        return p
    if p.is_symlink():
        raise InputError(f"is a symbolic link to a missing target ({os.readlink(p)})", file=str(p), field=field)
    parent = p.parent
    while (pst := stat_path(parent, field)) is None and parent != parent.parent:
        parent = parent.parent
    if pst is None or not stat.S_ISDIR(pst.st_mode):
        raise InputError(f"cannot be created: {parent} is a file, not a directory", file=str(p), field=field)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot be created: {parent} is not writable", file=str(p), field=field)
    _check_new_names(p, parent, field)
    # a uniquely named file in the nearest existing ancestor: nothing is left behind, and no
    # race with another process checking the same path at once (the ranks of an MPI run)
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".arena-write-check-"):
            pass
    except OSError as e:
        raise InputError(f"cannot be created: {e.strerror or e}", file=str(p), field=field) from None
    return p


def check_output_file(path: str | os.PathLike, field: str, regular: str | None = None) -> Path:
    """A file we can create or append to: not a directory, in a folder we can write into
    (or create). An existing regular file is opened for appending (nothing
    written) to prove it; a device such as /dev/null is taken as it is, unless ``regular``
    says why only a regular file will do (then a pipe, a device or a socket is refused)."""
    p = Path(path).expanduser()
    st = stat_path(p, field)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError("is a directory, not a file", file=str(p), field=field)
    if st is not None and regular and not stat.S_ISREG(st.st_mode):
        raise InputError(f"is not a regular file (a pipe, a device or a socket): {regular}", file=str(p),
                         field=field)
    if st is not None and not os.access(p, os.W_OK):
        raise InputError("file is not writable", file=str(p), field=field)
    if st is None and p.is_symlink():
        raise InputError(f"is a symbolic link to a missing target ({os.readlink(p)})", file=str(p), field=field)
    check_output_dir(p.parent, field)
    if st is None:
        _check_new_names(p, p.parent, field)
    if st is not None and stat.S_ISREG(st.st_mode):
        try:
            with open(p, "ab"):
                pass
        except OSError as e:
            raise InputError(f"file is not writable ({e.strerror or e})", file=str(p), field=field) from None
    return p


def _new_file_mode(p: Path) -> int:
    """The permissions ``p`` has (a file replaced keeps them), else those ``open`` would
    give a new file under this process's umask."""
    try:
        return stat.S_IMODE(p.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_output(path: str | os.PathLike, data: str | bytes, field: str | None = None) -> Path:
    """Write ``data`` (text as UTF-8) to the output file ``path``: a regular file (or a
    new one) is written beside it and renamed into place, so a failed write (a full disk)
    leaves the file as it was, never half written; anything else (``/dev/null``, a pipe) is
    written as it is, a pipe only when a reader holds its other end (else the write would
    wait for one forever). An ``OSError`` (``/dev/full``: no space left on device) is an
    ``InputError`` naming the file and ``field``."""
    p = Path(path).expanduser()
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if p.exists() and not p.is_file():
            try:                        # (a pipe with no reader: ENXIO at once, not a wait)
                fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                raise InputError("is a pipe that nothing reads: writing it would wait forever", file=str(p),
                                 field=field) from None
            os.set_blocking(fd, True)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            return p
        dest = Path(os.path.realpath(p)) if p.is_symlink() else p     # (through a link, as open() writes)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name[:64]}.", suffix=".partial")
        try:
            os.fchmod(fd, _new_file_mode(dest))       # (mkstemp's 0600 would narrow who may read it)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise InputError(f"could not be written: {e.strerror or e}", file=str(p), field=field) from None
    return p


def check_input_file(path: str | os.PathLike, field: str) -> Path:
    """An existing, readable regular file (a pipe, a device or a socket is refused without
    opening it: reading one may never end)."""
    p = Path(path).expanduser()
    st = stat_path(p, field)
    if st is None:
        raise InputError("file not found", file=str(p), field=field)
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a directory, not a file", file=str(p), field=field)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file (a pipe, a device or a socket)", file=str(p), field=field)
    if not os.access(p, os.R_OK):
        raise InputError("file is not readable", file=str(p), field=field)
    return p


def check_regular_file(path: str | os.PathLike, what: str) -> None:
    """Before reading a ``what`` file: refuse a pipe or a device (reading one hangs or never
    ends) and any OS refusal to look at the path (a name too long, a link loop), as an
    ``InputError`` naming the file. A missing path or a directory passes: the reader says
    so in its own words."""
    p = Path(path)
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as e:
        raise InputError(f"cannot read the {what}: {e.strerror or e}", file=str(p)) from None
    if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
        raise InputError(f"not a regular file (a pipe, a device or a socket): reading it as the {what} may "
                         "never end", file=str(p))


def real_path(path: str | os.PathLike) -> str:
    """``path`` made absolute with every symbolic link and ``..`` resolved (the parts that
    do not exist kept as given)."""
    return os.path.realpath(os.path.expanduser(path))


def within_roots(real: str, roots: tuple[str, ...]) -> bool:
    """Whether the resolved path ``real`` lies in one of the resolved folders ``roots``
    (the folder itself counts; ``/data2`` is not in ``/data``)."""
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def check_within_roots(path: str | os.PathLike, roots: tuple[str, ...], field: str, *, what: str,
                       how_to_allow: str = "") -> str:
    """``path`` resolved (symbolic links and ``..`` followed), which must lie in one of the
    folders ``roots`` (themselves resolved here), else an ``InputError`` naming ``field``,
    the path as given and as resolved, and the allowed folders. The same message whether
    or not the path exists, so a refusal says nothing about what lies outside the roots."""
    real = real_path(path)
    allowed = tuple(real_path(r) for r in roots)
    if not within_roots(real, allowed):
        shown = str(path) if real == str(path) else f"{path} (resolved: {real})"
        raise InputError(f"{shown} is outside the folders {what} may be read from: {', '.join(allowed)}"
                         f"{'; ' + how_to_allow if how_to_allow else ''}", field=field)
    return real
