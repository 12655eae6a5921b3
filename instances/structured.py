"""JSON and TOML text parsed behind one guard: every way a document can be unreadable is
an ``InputError`` naming the file (and the line where the parser says), never another
exception.

The guard covers what the parsers let through: nesting deeper than
``MAX_NESTING_DEPTH`` (``instances.limits``) is refused, whether the parser itself ran
out of stack (a ``RecursionError``) or built the document (TOML's dotted keys nest
without recursion) that code reading it later would recurse into; and an integer with
more digits than Python converts (a ``ValueError`` from the parser); and, in JSON, an
object that names a key twice (``json.loads`` keeps the last value without a word; TOML's
parser refuses a repeated key itself): refused naming the key and where its object stands
(``node_groups[0].num_nodes``). Every JSON or TOML
document a user hands the project goes through here: cluster files, ``config.json``
models, job files, the service API's bodies, profile stores, training configs.
"""
from __future__ import annotations

import json
import re
import tomllib
from typing import Any

from .errors import InputError
from .limits import MAX_NESTING_DEPTH


def _too_deep(kind: str, file: str | None, field: str | None) -> InputError:
    return InputError(f"{kind} nested too deeply (more than {MAX_NESTING_DEPTH} levels of arrays and objects)",
                      file=file, field=field)


_CONTAINERS = frozenset({dict, list, tuple})


def check_depth(obj: Any, *, kind: str = "JSON", file: str | None = None, field: str | None = None) -> Any:
    """``obj`` (a parsed document) if its arrays and objects nest at most
    ``MAX_NESTING_DEPTH`` deep, else an ``InputError``; iterative, so any depth is safe."""
    level = [obj] if isinstance(obj, (dict, list, tuple)) else []
    depth = 0
    while level:                        # one level of containers at a time
        depth += 1
        if depth > MAX_NESTING_DEPTH:
            raise _too_deep(kind, file, field)
        below: list[Any] = []
        for o in level:
            below.extend(c for c in (o.values() if isinstance(o, dict) else o) if type(c) in _CONTAINERS)
        level = below
    return obj


class _Repeated(dict):
    """An object that named ``key`` twice (the parse hook's mark, found after the parse)."""
    key: str


def _pairs_hook(found: list[_Repeated]):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        repeated = None
        for k, v in pairs:
            if k in out and repeated is None:
                repeated = k
            out[k] = v
        if repeated is None:
            return out
        mark = _Repeated(out)
        mark.key = repeated
        found.append(mark)
        return mark
    return hook


def _first_repeated(root: Any) -> tuple[_Repeated, str]:
    """The first object in document order that named a key twice, and where it stands, as
    the readers name fields (``node_groups[0]``, ``[0].a100``; "" for the root), walked
    without recursion."""
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Repeated):
            return node, path
        if isinstance(node, dict):
            items = [(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(v, f"{path}[{i}]") for i, v in enumerate(node)]
        else:
            continue
        stack.extend(reversed(items))       # the first child is looked at first
    raise AssertionError("no repeated key found")    # (only called when the hook found one)


def loads_json(text: str | bytes, *, file: str | None = None, field: str | None = None) -> Any:
    """The JSON document ``text`` (a leading byte-order mark is skipped), or an
    ``InputError`` naming ``file`` (and ``field``, e.g. an HTTP body; a key given twice is
    named below it: ``body.KEY``)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 text (byte {e.start}); expected JSON", file=file, field=field) from None
    try:
        found: list[_Repeated] = []
        doc = json.loads(text.removeprefix("\ufeff"), object_pairs_hook=_pairs_hook(found))
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e.msg}", file=file, line=e.lineno, field=field) from None
    except RecursionError:
        raise _too_deep("JSON", file, field) from None
    except ValueError as e:             # an integer past Python's digit limit
        raise InputError(f"not usable JSON: {e}", file=file, field=field) from None
    if found:
        obj, where = _first_repeated(doc)
        place = ".".join(p for p in (field, where, obj.key) if p).replace(".[", "[")
        raise InputError(f"key {obj.key!r} given twice in one object (the first value would be lost); give it once",
                         file=file, field=place)
    return check_depth(doc, kind="JSON", file=file, field=field)


_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')"""
# a dotted key of more parts than a document may nest (anywhere in the text; a string value
# of that shape is refused with it): tomllib takes time quadratic in a dotted key's length
# (30,000 parts, 60 kB: 25 s), so such a key is refused before parsing
_DEEP_DOTTED_KEY = re.compile(rf"{_KEY_PART}(?:[ \t]*\.[ \t]*{_KEY_PART}){{{MAX_NESTING_DEPTH},}}")


def loads_toml(text: str, *, file: str | None = None) -> dict[str, Any]:
    """The TOML document ``text``, or an ``InputError`` naming ``file`` and the line."""
    deep = _DEEP_DOTTED_KEY.search(text)
    if deep is not None:
        raise InputError(f"TOML nested too deeply (a dotted key of more than {MAX_NESTING_DEPTH} parts)",
                         file=file, line=text.count("\n", 0, deep.start()) + 1)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+)", str(e))
        raise InputError(f"malformed TOML: {e}", file=file, line=int(m.group(1)) if m else None) from None
    except RecursionError:
        raise _too_deep("TOML", file, None) from None
    except ValueError as e:             # an integer past Python's digit limit
        raise InputError(f"not usable TOML: {e}", file=file) from None
    return check_depth(doc, kind="TOML", file=file)
