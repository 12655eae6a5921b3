"""The policy seam and its registry.

A policy is an object built from validated config with one method,
``decide(ctx: RoundContext) -> Decisions``, a pure function of the round context.
Register a factory by name with ``@register_policy("name")``; the factory is called
with keyword config (and must reject unknown keys).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from .context import Decisions, RoundContext


class Policy(Protocol):
    name: str

    def decide(self, ctx: RoundContext) -> Decisions: ...


_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register_policy(name: str):
    def wrap(factory: Callable[..., Policy]):
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory
    return wrap


def _load_builtin_policies() -> None:
    # Importing the package registers every built-in policy.
    from . import policies  # noqa: F401


def policy_names() -> list[str]:
    _load_builtin_policies()
    return sorted(_REGISTRY)


def make_policy(name: str, **config: Any) -> Policy:
    _load_builtin_policies()
    if name not in _REGISTRY:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**config)
