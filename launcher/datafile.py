"""The training data file of a token model (``arena train --data``, a service job's
``data``): checked before anything starts, and opened by the ranks with the same checks.
No torch here: the service's submission check imports it.

What the file may contain: anything. The reader (``launcher.data.TextFileTokens``) takes
the file as bytes, each byte one token (its value modulo the model's vocabulary): UTF-8
text (a character outside ASCII is two to four tokens), text in another encoding, or
binary data all train; nothing is decoded or tokenised. A sample is a window of
``seq_len + 1`` consecutive bytes at a seeded offset drawn from ``[0, size - seq_len - 1)``,
so the file holds at least ``seq_len + 2`` bytes (``min_data_bytes``), and at most
``MAX_DATA_BYTES``.

The checks (``open_data_file``): a regular file (a folder, pipe, device or socket is
refused from its status, before it is opened; the open does not block, so a path swapped
for a pipe meanwhile cannot hang it, and the opened file's status is checked again),
readable, of a size in those bounds, and, when ``roots`` are given (the service's
``--data-root`` folders), inside one of them once every symbolic link and ``..`` is
resolved, both for the path as given (before it is opened: a path outside is refused
without looking at it) and for the file actually opened (``/proc/self/fd``: a link
swapped between the check and the open cannot lead outside).
"""
from __future__ import annotations

import os
import stat

from instances.errors import InputError
from instances.paths import check_within_roots, real_path, within_roots

MAX_DATA_BYTES = 64 * 2**30           # 64 GiB: larger is taken for a mistake (a disk image, a sparse file)
DATA_ROOT_FLAG = "arena serve --data-root DIR"    # how an operator allows another folder


class DataFileRefused(InputError):
    """A data file refused by ``open_data_file``: when a launch meets it, the job fails for
    good with this reason (retrying cannot help, and the job must not train on another file)."""


def min_data_bytes(seq_len: int) -> int:
    """The smallest data file the reader takes: one sample of ``seq_len + 1`` bytes and one
    offset more to draw from."""
    return seq_len + 2


def open_data_file(path: str, *, min_bytes: int, roots: tuple[str, ...] | None = None,
                   field: str = "data") -> tuple[int, int]:
    """Open ``path`` read-only after the checks above; (file descriptor, size in bytes).
    Raises ``DataFileRefused`` naming the file and ``field``."""
    def refuse(reason: str) -> DataFileRefused:
        return DataFileRefused(reason, file=str(path), field=field)

    if roots is not None:
        try:
            check_within_roots(path, roots, field, what="training data",
                               how_to_allow=f"move the file into one of them, or ask the operator to add its "
                                            f"folder ({DATA_ROOT_FLAG})")
        except InputError as e:
            raise refuse(e.reason) from None
    try:
        before = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise refuse("file not found") from None
    except OSError as e:
        raise refuse(f"cannot be used: {e.strerror or e}") from None
    if stat.S_ISDIR(before.st_mode):
        raise refuse("is a folder, not a data file")
    if not stat.S_ISREG(before.st_mode):
        raise refuse("not a regular file (a pipe, a device or a socket); a data file is a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except PermissionError:
        raise refuse("not readable (permission denied)") from None
    except OSError as e:
        raise refuse(f"cannot be opened: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse("not a regular file (it was replaced as it was opened)")
        if roots is not None:
            opened = f"/proc/self/fd/{fd}"
            real = os.readlink(opened) if os.path.exists(opened) else real_path(path)
            allowed = tuple(real_path(r) for r in roots)
            if not within_roots(real, allowed):
                raise refuse(f"the file opened ({real}) is outside the folders training data may be read from: "
                             f"{', '.join(allowed)} (the path was changed as it was opened)")
        size = st.st_size
        if size == 0:
            raise refuse("is empty")
        if size < min_bytes:
            raise refuse(f"holds {size} bytes; the model needs at least {min_bytes}: a sample is {min_bytes - 1} "
                         f"bytes (its context + 1 tokens, one byte each) and the file must be longer than one sample")
        if size > MAX_DATA_BYTES:
            raise refuse(f"is {size:,} bytes, over the {MAX_DATA_BYTES:,} bytes ({MAX_DATA_BYTES // 2**30} GiB) a "
                         f"data file may hold")
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def check_data_file(path: str, *, min_bytes: int, roots: tuple[str, ...] | None = None,
                    field: str = "data") -> int:
    """``open_data_file``'s checks without keeping the file open; its size in bytes."""
    fd, size = open_data_file(path, min_bytes=min_bytes, roots=roots, field=field)
    os.close(fd)
    return size
