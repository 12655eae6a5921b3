"""Keys for "the same inputs as last round": the memos that keep one round's derived
structures for the next (``formulation.build.RowsMemo``, ``solvers.lagrangian``'s
``_Memo``) compare their inputs element for element, never by hash, so a reuse is exact."""
from __future__ import annotations

import numpy as np


def kept(key: tuple) -> tuple:
    """``key`` with its arrays copied (a caller writing into an array later does not
    change what was remembered)."""
    return tuple(x.copy() if isinstance(x, np.ndarray) else x for x in key)


def same(a: tuple | None, b: tuple) -> bool:
    """Whether the keys ``a`` (None: nothing remembered) and ``b`` are equal item by
    item: arrays by value (``np.array_equal``), anything else by ``==``."""
    if a is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True
