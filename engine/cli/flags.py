"""Flags derived from the config they set, and config errors named by the flag that set
the value.

A config dataclass (``ServiceConfig``, ...) marks each field that a command-line flag sets
with ``dataclasses.field(metadata={"flag": "--round-interval", "help": ..., "metavar": "S"})``
(optional keys: ``choices``, ``action`` (``"append"`` for a repeatable flag), ``default``
for a field that the dataclass requires but the flag defaults, ``required`` (true) for a
field with no default that the command cannot run without, ``type`` for a parser of the
value other than the annotation's, e.g. ``seed_arg``). ``add_config_flags`` makes the
argparse arguments from that metadata, in field order: the type from the field's
annotation (``int``/``float``, ``X | None`` unwrapped; ``str`` untyped; ``bool`` a
switch), the default from the dataclass's (``%(default)s`` in the help shows it), the
destination the field's name, the value's placeholder the flag's (``--time-limit
TIME_LIMIT``) unless ``metavar`` names one; ``help`` is a string, or a function of no arguments that
makes it when the parser is built (a help that lists registered names, plug-ins'
included). ``config_values`` reads them back (a repeatable flag not given leaves the
field's default), and ``config_flags`` is the field -> flag table. So adding a knob is
one edit: the field with its metadata. Several calls with ``only``/``skip`` place a
config's flags among others (or in a mutually exclusive group) in the order ``--help``
lists them.

A command builds validated config objects (``TrainConfig``, ``ServiceConfig``, a
performance model, a solver backend) from its flags; their ``InputError`` names the
config's own field (``stall_timeout_s``). Inside ``fields_as_flags(TABLE)`` such an error
is raised again naming the flag as the user types it (``--stall-timeout``). Each command
keeps its table beside its parser (derived with ``config_flags`` where the config carries
its flags); tests/test_cli_flags.py checks every table against the config's fields and the
parser's flags, and that a bad value of each flag is named by it.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

from instances.errors import InputError

FLAG_KEYS = frozenset({"flag", "help", "metavar", "choices", "action", "default", "type", "required"})


def _flag_fields(cls: type, only: Iterable[str] | None = None,
                 skip: Iterable[str] = ()) -> list[dataclasses.Field]:
    """``cls``'s fields that a flag sets (metadata ``flag``), in field order; ``only``
    and ``skip`` pick some by name (each name must be such a field)."""
    flagged = [f for f in dataclasses.fields(cls) if "flag" in f.metadata]
    names = {f.name for f in flagged}
    picked = set(names if only is None else only)
    skipped = set(skip)
    unknown = (picked | skipped) - names
    if unknown:
        raise KeyError(f"{cls.__name__} has no flag field {', '.join(sorted(unknown))}")
    return [f for f in flagged if f.name in picked and f.name not in skipped]


def _base_type(hint: Any) -> Any:
    """``X`` of ``X | None`` (``Optional[X]``); the hint itself otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def add_config_flags(parser: Any, cls: type, only: Iterable[str] | None = None,
                     skip: Iterable[str] = ()) -> None:
    """Add to ``parser`` (a parser or an argument group) one argument per field of the
    dataclass ``cls`` whose metadata names a ``flag`` (see the module's doc)."""
    hints = typing.get_type_hints(cls)
    for f in _flag_fields(cls, only, skip):
        meta = f.metadata
        extra = set(meta) - FLAG_KEYS
        if extra:
            raise KeyError(f"{cls.__name__}.{f.name}: unknown flag metadata {', '.join(sorted(extra))}")
        if meta.get("required"):                            # a flag the command cannot run without
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING \
                    or "default" in meta:
                raise TypeError(f"{cls.__name__}.{f.name}: a required flag has no default")
            default = None
        elif "default" in meta:
            default = meta["default"]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: a flag needs a default (the field's or metadata 'default'), "
                            "or metadata 'required'")
        text = meta.get("help")
        kw: dict[str, Any] = {"dest": f.name, "default": default, "help": text() if callable(text) else text}
        if meta.get("required"):
            kw["required"] = True
        base = _base_type(hints[f.name])
        action = meta.get("action")
        if action is not None:
            kw["action"] = action
            if action == "append":                          # a repeatable flag: the element's type
                kw["default"] = None                        # (not given: the field's default, config_values)
                elem = typing.get_args(base)[:1]
                if elem and elem[0] in (int, float):
                    kw["type"] = elem[0]
        elif base is bool:
            kw["action"] = "store_true"
        elif base in (int, float):
            kw["type"] = base
        if "type" in meta:
            kw["type"] = meta["type"]
        if "metavar" in meta:
            kw["metavar"] = meta["metavar"]
        elif "choices" not in meta and kw.get("action") != "store_true":     # as the flag, not the field
            kw["metavar"] = meta["flag"].lstrip("-").upper().replace("-", "_")
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        parser.add_argument(meta["flag"], **kw)


def config_values(args: Any, cls: type) -> dict[str, Any]:
    """The values of ``cls``'s flag fields as parsed into ``args`` (by ``add_config_flags``),
    keyed by field name: keyword arguments for ``cls``; a repeatable flag not given is left
    out (the field's default holds)."""
    return {f.name: getattr(args, f.name) for f in _flag_fields(cls)
            if not (f.metadata.get("action") == "append" and getattr(args, f.name) is None)}


def config_flags(cls: type) -> dict[str, str]:
    """``cls``'s field -> flag table (for ``fields_as_flags``)."""
    return {f.name: f.metadata["flag"] for f in _flag_fields(cls)}


def config_not_flags(cls: type) -> frozenset[str]:
    """``cls``'s fields that no flag sets (their defaults hold)."""
    return frozenset(f.name for f in dataclasses.fields(cls) if "flag" not in f.metadata)


@contextmanager
def fields_as_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """Raise an ``InputError`` whose field is a key of ``flags`` again with the flag as
    its field (the file, line and reason kept)."""
    try:
        yield
    except InputError as e:
        if e.field is None or e.field not in flags:
            raise
        raise InputError(e.reason, file=e.file, line=e.line, field=flags[e.field]) from None
