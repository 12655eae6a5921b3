"""Objective terms: a registry by name and a validated, weighted combination.

A term is a frozen dataclass (its fields are the term's options, validated in
``__post_init__``) with ``apply(data, builder, weight)``, which adds coefficients on
the choice variables and/or extra variables and rows to the shared model. The model is
maximized; a penalty is a negative coefficient. Adding a research objective means one
new module here with ``@register_term("name")`` plus a test, nothing else.

A term may declare itself ``columnwise`` (a class attribute or a property; absent means
no): what it adds on a column depends only on that column and on per-job arrays, never
on the job's other columns, and the rows it adds do not depend on which columns exist.
Applying it to a round restricted to some columns (``RoundData.restricted``) then gives
exactly the full model restricted to them, which lets the incremental search build its
model from its candidate columns alone (``engine/decide/incremental/round.py``); a test holds
every term that declares it to that.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from instances.errors import InputError
from instances.limits import MAX_COEFFICIENT, MAX_TIME_S, TIME_BOUND, check_coefficient, show_number
from instances.registry import Registry

if TYPE_CHECKING:
    from ..formulation.model import ModelBuilder
    from ..formulation.round_data import RoundData


class ObjectiveTerm(Protocol):
    name: str

    def apply(self, data: RoundData, builder: ModelBuilder, weight: float) -> None: ...


TERMS: Registry[type] = Registry("objective term", package="engine.decide.objectives", field="objective")


def register_term(name: str):
    """Register a term class (a dataclass) under ``name``; its ``name`` attribute is set."""
    def wrap(cls: type) -> type:
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"objective term {name!r} must be a dataclass")
        setattr(cls, "name", name)
        return TERMS.register(name)(cls)
    return wrap


term_names = TERMS.names


def _coerce(value: Any, annotation: str, where: str) -> Any:
    ann = annotation.replace(" ", "")
    if not isinstance(value, str):
        if ann == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:       # an integer past float's range: refused by the bounds
                return (math.inf if value > 0 else -math.inf)
        if ann == "int" and isinstance(value, bool):
            raise InputError(f"expected an integer, got {value!r}", field=where)
        return value
    s = value.strip()
    try:
        if ann == "float":
            return float(s)
        if ann == "int":
            return int(s)
        if ann == "bool":
            if s.lower() in ("1", "true", "yes", "on"):
                return True
            if s.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(s)
    except ValueError:
        raise InputError(f"expected {ann}, got {value!r}", field=where) from None
    return s


def _bounded(value: Any, where: str) -> None:
    """A numeric term option within the bounds on input (``instances.limits``): finite; a
    time (an option named ``*_s``) at most ``MAX_TIME_S``, any other number of magnitude
    at most ``MAX_COEFFICIENT``. The term's own check says what else it needs (a sign, a
    range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    try:
        f = float(value)
    except OverflowError:
        f = (math.inf if value > 0 else -math.inf)
    if where.endswith("_s"):
        if math.isfinite(f) and f <= MAX_TIME_S:
            return
        reason = TIME_BOUND if f > MAX_TIME_S else "must be a finite number of seconds"
    else:
        if math.isfinite(f) and abs(f) <= MAX_COEFFICIENT:
            return
        reason = (f"must be a finite number in [-{MAX_COEFFICIENT:g}, {MAX_COEFFICIENT:g}] (larger values "
                  f"overflow or ill-condition the objective)")
    raise InputError(f"{reason}, got {show_number(value)}", field=where)


def make_term(name: str, **options: Any):
    """Build a term from keyword options (strings from the command line are converted);
    every numeric option is within the bounds on input (``_bounded``)."""
    cls = TERMS.get(name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in options.items():
        if k not in fields:
            raise InputError(f"objective term {name!r} has no option {k!r}; options: "
                             f"{', '.join(sorted(fields)) or '(none)'}", field=f"{name}.{k}")
        kwargs[k] = _coerce(v, str(fields[k].type), f"{name}.{k}")
        _bounded(kwargs[k], f"{name}.{k}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(str(e), field=name) from None


@dataclass(frozen=True)
class Objective:
    """Weighted objective terms, applied in order."""
    terms: tuple[tuple[float, ObjectiveTerm], ...]

    def __post_init__(self):
        for w, t in self.terms:
            check_coefficient(w, field=f"w_{t.name}", what=f"weight of term {t.name!r}: ")

    @property
    def columnwise(self) -> bool:
        """Whether every weighted term is columnwise (module doc)."""
        return all(bool(getattr(t, "columnwise", False)) for w, t in self.terms if w > 0)

    def apply(self, data: RoundData, builder: ModelBuilder) -> None:
        for w, term in self.terms:
            if w > 0:
                term.apply(data, builder, w)

    def describe(self) -> dict[str, Any]:
        return {t.name: {"weight": w, **dataclasses.asdict(t)} for w, t in self.terms}  # type: ignore[call-overload]


def split_objective_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split policy config into objective keys (``w_<term>``, ``<term>.<option>``) and the rest."""
    obj, rest = {}, {}
    for k, v in config.items():
        if k.startswith("w_") or ("." in k and k.split(".", 1)[0] in TERMS):
            obj[k] = v
        else:
            rest[k] = v
    return obj, rest


def parse_objective(config: Mapping[str, Any], defaults: Mapping[str, float]) -> Objective:
    """``w_<term>=weight`` sets a weight (0 switches a term off), ``<term>.<opt>=value`` an
    option; ``defaults`` gives the weights of terms not mentioned."""
    weights = dict(defaults)
    options: dict[str, dict[str, Any]] = {}
    for k, v in config.items():
        if k.startswith("w_"):
            name = k[2:]
            if name not in TERMS:
                raise InputError(f"unknown objective term {name!r}; known: {', '.join(term_names())}",
                                 field=k)
            w = check_coefficient(_coerce(v, "float", k), field=k, what="weight ")
            weights[name] = w
        elif "." in k:
            name, opt = k.split(".", 1)
            if name not in TERMS:
                raise InputError(f"unknown objective term {name!r}; known: {', '.join(term_names())}",
                                 field=k)
            options.setdefault(name, {})[opt] = v
        else:
            raise InputError(f"not an objective key: {k!r} (use w_<term> or <term>.<option>)", field=k)
    for name in options:
        if weights.get(name, 0.0) <= 0:
            raise InputError(f"options given for term {name!r} whose weight is 0", field=name)
    terms = tuple((w, make_term(n, **options.get(n, {}))) for n, w in weights.items() if w > 0)
    return Objective(terms)
