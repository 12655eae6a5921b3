"""The policy seam and its registry.

A policy is an object built from validated config (``Policy``): a ``name``, whether it
is ``event_driven``, its ``max_queued`` window and ``decide(ctx: RoundContext) ->
Decisions``, a pure function of the round context. Register a factory by name with
``@register_policy("name")`` in a module of ``engine/decide/policies/`` (every module
there is discovered; no list to edit); the factory is called with keyword config (and
must reject unknown keys). A class that subclasses ``Policy`` inherits the defaults of
``event_driven`` and ``max_queued``; one that matches it structurally states all four
(``policy_lacks`` names what a built object misses; ``arena`` refuses such a policy).

- ``event_driven``: asked only after an event (engine/core/round_loop.py).
- ``max_queued`` (an int >= 0; 0: no window): it decides over every running job and at
  most this many queued jobs, those of the highest priority, then the earliest arrival,
  then the job id; the loop then builds views only for those,
  ``RoundContext.queued_left_out`` counting the others
  (``engine.decide.policies.milp.queue_window``).
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Iterable, Protocol

from instances.errors import InputError
from instances.registry import Registry

from .context import Decisions, RoundContext


class Policy(Protocol):
    name: str
    event_driven: bool = False      # asked only after an event (arrival, completion, failure)
    max_queued: int = 0             # queued jobs it is given at most (0: all)

    def decide(self, ctx: RoundContext) -> Decisions: ...


def refuse_unknown_options(name: str, options: Iterable[str], known: Collection[str], *, scope: str = "",
                           known_text: str | None = None) -> None:
    """A policy's options checked against the ones it reads: an ``InputError`` naming
    the first unknown one (its field) and listing ``known`` (or ``known_text``); ``scope``
    follows the unknown names in the message (e.g. " for goodput jobs")."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(f"policy {name!r}: unknown option(s) {unknown}{scope}; "
                         f"known: {known_text if known_text is not None else list(known)}", field=unknown[0])


def policy_lacks(policy: object) -> list[str]:
    """What ``policy`` misses of ``Policy`` (empty: nothing), each as ``attribute (type)``."""
    lacks = [] if callable(getattr(policy, "decide", None)) else ["decide(ctx)"]
    if not isinstance(getattr(policy, "name", None), str):
        lacks.append("name (str)")
    if not isinstance(getattr(policy, "event_driven", None), bool):
        lacks.append("event_driven (bool)")
    window = getattr(policy, "max_queued", None)
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        lacks.append("max_queued (int >= 0)")
    return lacks


POLICIES: Registry[Callable[..., Policy]] = Registry("policy", package="engine.decide.policies")
register_policy = POLICIES.register
policy_names = POLICIES.names


def make_policy(name: str, **config: Any) -> Policy:
    """A policy by registered name, built from keyword config (``InputError`` if unknown)."""
    return POLICIES.get(name)(**config)
