"""JSON a user gives (cluster files and Arena's cluster specs, ``config.json`` models, train
configs, the service's request bodies, profile stores), parsed so that no key is lost.

``json.loads`` keeps the last of two values given for one key, without a word: a cluster
file with ``"name"`` twice, or a node group with ``"num_nodes"`` twice, would be read as if
the first were not there. ``loads_unique`` parses as ``json.loads`` does (its errors are
``json.JSONDecodeError``, for each reader to word) and refuses an object that names a key
twice: an ``InputError`` naming the key and where the object stands (``node_groups[0]``).
"""
from __future__ import annotations

import json
from typing import Any

from .errors import InputError


class _Repeated(dict):
    """An object that named ``key`` twice (the hook's mark, found after the parse)."""
    key: str


def _pairs(found: list[_Repeated]):
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


def loads_unique(text: str | bytes, *, file: str | None = None) -> Any:
    """``json.loads(text)``, refusing an object with a key given twice (``InputError``
    naming ``file``, and the key with its object's place as the field)."""
    found: list[_Repeated] = []
    data = json.loads(text, object_pairs_hook=_pairs(found))
    if found:
        obj, where = _first_repeated(data)
        raise InputError(f"key {obj.key!r} given twice in one object (the first value would be lost); "
                         "give it once", file=file, field=f"{where}.{obj.key}" if where else obj.key)
    return data
