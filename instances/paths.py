"""Output paths checked before any work starts, so a bad ``--out`` or checkpoint folder
fails in the first second, not after a long run."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError


def check_output_dir(path: str | os.PathLike, field: str) -> Path:
    """A folder we can write into: an existing writable directory, or a path whose nearest
    existing ancestor is a writable directory (it is created later, by the writer).
    Raises ``InputError`` naming ``field`` otherwise."""
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise InputError("exists and is not a directory", file=str(p), field=field)
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError("directory is not writable", file=str(p), field=field)
        return p
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"cannot be created: {parent} is a file, not a directory", file=str(p), field=field)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot be created: {parent} is not writable", file=str(p), field=field)
    return p


def check_output_file(path: str | os.PathLike, field: str) -> Path:
    """A file we can create or append to: not a directory, in a folder we can write into."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError("is a directory, not a file", file=str(p), field=field)
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError("file is not writable", file=str(p), field=field)
    check_output_dir(p.parent, field)
    return p


def check_input_file(path: str | os.PathLike, field: str) -> Path:
    """An existing, readable regular file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError("file not found", file=str(p), field=field)
    if p.is_dir():
        raise InputError("is a directory, not a file", file=str(p), field=field)
    if not os.access(p, os.R_OK):
        raise InputError("file is not readable", file=str(p), field=field)
    return p
