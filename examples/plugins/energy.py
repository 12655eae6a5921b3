"""An example plug-in (docs/architecture.md, "Plug-ins"): an objective term that prices
the power a column's GPUs draw, and a policy that adds it to ``arena``'s objective. It
lives outside the package and is loaded by name:

    arena bench policies --plugin examples/plugins/energy.py --instance demo \
        --policy arena --policy arena-energy

Term ``energy`` (illustrative, not a validated energy model): the coefficient of
x[job, column] is ``-weight * GPUs * board_power(type) / reference_w``, a penalty of
``weight`` per GPU-equivalent of ``reference_w`` watts held. It counts board power
while held, not measured draw: an idle or communication-bound GPU is charged in full.
Options: ``watts`` (``TYPE=W,...``, catalog names or their aliases; defaults are the
vendors' published maximum board powers of the catalog's GPU types: A100 SXM4 400 W,
H100/H200 SXM 700 W, V100 SXM2 300 W, A40 300 W, A10 150 W, L20 275 W) and
``reference_w`` (300). A GPU type the option does not list (``cpu``, the live
service's stand-in, among them) is an error naming it, never a free GPU.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from engine.decide.objectives.base import register_term
from engine.decide.policies.arena import ARENA
from engine.decide.policies.milp import register_milp_policy
from instances.errors import InputError
from instances.gpus import canonical_gpu_name

DEFAULT_WATTS = "a100-40gb=400,a100-80gb=400,h100-sxm=700,h200=700,v100-32gb=300,a40=300,a10=150,l20=275"


def parse_watts(text: str) -> dict[str, float]:
    """{catalog GPU name: watts} from ``TYPE=W,...``; a ValueError naming a bad item."""
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            w = float(value)
        except ValueError:
            w = float("nan")
        if not sep or not name.strip() or not w > 0:
            raise ValueError(f"energy.watts: expected TYPE=WATTS,... with WATTS > 0, got {item!r}")
        out[canonical_gpu_name(name)] = w
    return out


@register_term("energy")
@dataclass(frozen=True)
class Energy:
    watts: str = DEFAULT_WATTS
    reference_w: float = 300.0
    # a column's coefficient reads only that column (its GPUs and type): the incremental
    # search may build its model from its candidate columns alone (docs/engine.md)
    columnwise: ClassVar[bool] = True

    def __post_init__(self):
        self.table                          # parsed (and checked) once, not every round
        if not self.reference_w > 0:
            raise ValueError(f"energy.reference_w must be > 0, got {self.reference_w!r}")

    @cached_property
    def table(self) -> dict[str, float]:
        return parse_watts(self.watts)

    def apply(self, data, builder, weight: float) -> None:
        if data.n_cols == 0:
            return
        table = self.table
        missing = sorted(set(data.capacity.types) - set(table))
        if missing:
            raise InputError(f"energy.watts has no board power for GPU type(s) {', '.join(missing)} "
                             f"(give --policy-opt energy.watts=TYPE=W,...)", field="energy.watts")
        per_type = np.array([table[t] for t in data.capacity.types]) / self.reference_w
        builder.add_x_objective(-weight * data.col_gpus * per_type[data.col_type])


# ``arena-energy``: arena's objective plus the energy term at 0.05 per 300 W GPU held
# (a job at its reference allocation is worth 1 per round in the throughput term).
register_milp_policy(dataclasses.replace(ARENA, name="arena-energy", weights={**ARENA.weights, "energy": 0.05}))
