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

Before its first round, wherever a policy meets what it will decide for (``arena
simulate``, ``arena bench policies``, ``arena serve``), ``check_policy_for(policy,
workload)`` asks it whether it can decide there (``Workload``: the kind of jobs, the
instance): a policy may define ``check_workload(workload)``, which raises an
``InputError`` for jobs it cannot decide and for any option it was given that it would
not read there (naming the option, the policy and the workload), so that no option is
ignored without a word.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Protocol

from instances.errors import InputError
from instances.goodput import is_goodput
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


@dataclass(frozen=True)
class Workload:
    """What a policy will decide for, known before its first round (``check_policy_for``).

    ``name`` says it in messages (``instance 'demo'``, ``the live service``); ``goodput``:
    its jobs are the Sia artifact's adaptive-batch goodput jobs (instances/goodput.py),
    else fixed-batch jobs; ``truth``: its truth oracle where one is known (a ``sia:``
    instance's holds the artifact, whose defaults some options override);
    ``idle_limit_s``: how long the run may sit with jobs queued and nothing running
    before it is stopped as stalled (a simulation's run-out; None: never)."""
    name: str
    goodput: bool = False
    truth: Any = None
    idle_limit_s: float | None = None

    @classmethod
    def of_jobs(cls, name: str, jobs: Iterable[Any], *, truth: Any = None,
                idle_limit_s: float | None = None) -> Workload:
        """The workload of ``jobs`` (all goodput jobs, or none: a mix is refused, as a round
        of both kinds would be)."""
        kinds = {is_goodput(j) for j in jobs}
        if len(kinds) > 1:
            raise InputError(f"{name} mixes the Sia artifact's goodput jobs with fixed-batch jobs; policies decide "
                             "for one kind at a time", field="--instance")
        return cls(name, kinds == {True}, truth, idle_limit_s)

    @property
    def jobs_text(self) -> str:
        return "the Sia artifact's goodput jobs" if self.goodput else "fixed-batch jobs"


def refuse_unread(policy: str, given: Iterable[str], unread: Collection[str], workload: Workload,
                  why: str) -> None:
    """An ``InputError`` naming the first option of ``given`` that is in ``unread``: the
    policy would not read it on ``workload`` (``why`` says what decides there)."""
    bad = sorted(set(given) & set(unread))
    if bad:
        raise InputError(f"policy {policy!r}: option {bad[0]} is not read on {workload.name} "
                         f"({workload.jobs_text}): {why}; drop {', '.join(bad)}", field=bad[0])


def check_policy_for(policy: object, workload: Workload) -> None:
    """Before any round: the policy's own ``check_workload`` (when it has one), which
    refuses jobs it cannot decide and options it would not read on ``workload``."""
    check = getattr(policy, "check_workload", None)
    if callable(check):
        check(workload)


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
