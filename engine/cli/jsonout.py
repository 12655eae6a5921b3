"""Strict JSON for ``--json`` output and results files: a value that is not a finite
number (NaN, infinity: a gap no solver proved, a mean over no job) is written as
``null``, so every standard JSON parser reads it (``json.dumps`` would write ``NaN``, which
JavaScript's ``JSON.parse`` and strict parsers refuse)."""
from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (numpy's included) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if type(obj).__module__ == "numpy" and hasattr(obj, "item"):     # numpy scalars
        return finite(obj.item())
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    return json.dumps(finite(obj), allow_nan=False, **kw)
