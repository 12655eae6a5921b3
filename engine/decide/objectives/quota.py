"""Per-tenant GPU quotas: sum of GPUs over a tenant's chosen grids <= its quota.

``quotas`` is "tenant=GPUs,tenant=GPUs"; tenants not listed are unlimited. The term
adds rows only (its weight just switches it on).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import register_term


def parse_quotas(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"quota.quotas: expected tenant=GPUs, got {part!r}")
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"quota.quotas: GPUs for {name!r} must be an integer, got {value!r}") from None
        if n < 0:
            raise ValueError(f"quota.quotas: GPUs for {name!r} must be >= 0")
        out[name.strip()] = n
    return out


@register_term("quota")
@dataclass(frozen=True)
class TenantQuota:
    quotas: str = ""
    columnwise: ClassVar[bool] = True

    def __post_init__(self):
        parse_quotas(self.quotas)

    def apply(self, data, builder, weight: float) -> None:
        quotas = parse_quotas(self.quotas)
        names = [t for t in sorted(quotas)]
        if not names:
            return
        tenant_of_job = np.array([names.index(t) if t in quotas else -1 for t in data.tenants], dtype=np.int64)
        row_of_col = tenant_of_job[data.col_job] if data.n_jobs else np.zeros(0, dtype=np.int64)
        cols = np.flatnonzero(row_of_col >= 0)
        builder.add_rows(row_of_col[cols], cols, data.col_gpus[cols].astype(float), -np.inf,
                         np.array([quotas[t] for t in names], dtype=float),
                         [f"quota_{t}" for t in names])
