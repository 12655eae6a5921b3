"""Config errors named by the flag that set the value.

A command builds validated config objects (``TrainConfig``, ``ServiceConfig``, a
performance model, a solver backend) from its flags; their ``InputError`` names the
config's own field (``stall_timeout_s``). Inside ``fields_as_flags(TABLE)`` such an error
is raised again naming the flag as the user types it (``--stall-timeout``). Each command
keeps its table beside its parser; tests/test_cli_flags.py checks every table against the
config's fields and the parser's flags, and that a bad value of each flag is named by it.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping

from instances.errors import InputError


@contextmanager
def fields_as_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """Raise an ``InputError`` whose field is a key of ``flags`` again with the flag as
    its field (the file, line and reason kept)."""
    try:
        yield
    except InputError as e:
        if e.field not in flags:
            raise
        raise InputError(e.reason, file=e.file, line=e.line, field=flags[e.field]) from None
