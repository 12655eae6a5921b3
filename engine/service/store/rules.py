"""The state machine of the service's store: job statuses and their transitions,
launch states and theirs, and the errors a change they do not allow raises."""
from __future__ import annotations

JOB_STATUSES = ("queued", "running", "held", "finished", "failed", "cancelled")
TERMINAL = frozenset({"finished", "failed", "cancelled"})
TRANSITIONS = {
    # queued -> finished: a job whose last launch completed its training as it was being
    # stopped (a preemption or a move decided at its last step)
    "queued": frozenset({"running", "held", "cancelled", "failed", "finished"}),
    "running": frozenset({"queued", "finished", "failed", "cancelled"}),   # queued: preempted
    # held: set aside by a user (a running job is stopped with a checkpoint first, so it
    # is held from the queue); released back to the queue, or cancelled
    "held": frozenset({"queued", "cancelled"}),
    "finished": frozenset(), "failed": frozenset(), "cancelled": frozenset(),
}
LAUNCH_STATES = ("intent", "started", "finished", "failed")
ACTIVE_LAUNCH = frozenset({"intent", "started"})
LAUNCH_TRANSITIONS = {
    "intent": frozenset({"started", "failed"}),        # failed: it never started
    "started": frozenset({"finished", "failed"}),
    "finished": frozenset(), "failed": frozenset(),
}
MAX_KEY_CHARS = 200          # a submission's idempotency key


class StateConflict(ValueError):
    """A change the state machine does not allow now (e.g. cancelling a finished job)."""


class StaleGeneration(StateConflict):
    """A message from a launch that is no longer the job's latest."""
