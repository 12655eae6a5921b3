"""The policy seam and its registry.

A policy is an object built from validated config with one method,
``decide(ctx: RoundContext) -> Decisions``, a pure function of the round context.
Register a factory by name with ``@register_policy("name")`` in a module of
``engine/decide/policies/`` (every module there is discovered; no list to edit); the factory is
called with keyword config (and must reject unknown keys).

Optional attributes a policy may have, read by the round loop: ``event_driven`` (asked
only after an event; engine/core/round_loop.py) and ``max_queued`` (an int > 0: it decides
over every running job and at most this many queued jobs, those of the highest priority,
then the earliest arrival, then the job id; the loop then builds views only for those,
``RoundContext.queued_left_out`` counting the others; ``engine.decide.policies.milp.queue_window``).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from instances.registry import Registry

from .context import Decisions, RoundContext


class Policy(Protocol):
    name: str

    def decide(self, ctx: RoundContext) -> Decisions: ...


POLICIES: Registry[Callable[..., Policy]] = Registry("policy", package="engine.decide.policies")
register_policy = POLICIES.register
policy_names = POLICIES.names


def make_policy(name: str, **config: Any) -> Policy:
    """A policy by registered name, built from keyword config (``InputError`` if unknown)."""
    return POLICIES.get(name)(**config)
