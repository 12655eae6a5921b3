"""Whether a policy can decide this service's jobs, asked once before the service starts.

The service runs fixed-batch torch jobs (``JobSpec.to_job``). A policy built for other
jobs (``pollux`` decides only the Sia artifact's adaptive-batch goodput jobs) would be
accepted at start and stop the scheduler at the first submission. So ``arena serve``
asks a fresh copy of the policy (and of the shadow policy) to decide one trial round:
one small job (``PROBE``) queued on the service's cluster, with the service's
performance model and move prices, as the simulator's first round would. A refusal or
any failure is an ``InputError`` on the policy's flag, before anything is made; the
copy is thrown away, so nothing the trial taught it reaches the service's rounds.
"""
from __future__ import annotations

from engine.core.context import Decisions, JobView, RoundContext
from instances.cluster import ClusterSpec
from instances.errors import InputError

from .jobspec import JobSpec

PROBE = JobSpec("probe", "tiny-gpt__2L", 8, 10)      # the smallest catalog model, as `arena submit` would send it


def check_policy_decides(policy, cluster: ClusterSpec, perf, reconfig, *, flag: str = "--policy") -> None:
    """Refuse (``InputError`` on ``flag``) a policy that cannot decide a trial round of
    one of this service's jobs; ``policy`` is a copy built for the trial."""
    job = PROBE.to_job("probe", 0.0)
    ctx = RoundContext(0.0, 1, 60.0, cluster, (JobView(job, float(job.num_iterations), None),), perf, reconfig)
    name = getattr(policy, "name", type(policy).__name__)
    try:
        decisions = policy.decide(ctx)
    except InputError as e:
        raise InputError(f"policy {name!r} cannot decide this service's jobs (fixed-batch torch jobs, as "
                         f"`arena submit` sends them): {e.reason}", field=flag) from None
    except Exception as e:
        raise InputError(f"policy {name!r} failed on a trial round of one of this service's jobs: "
                         f"{type(e).__name__}: {e}", field=flag) from None
    if not isinstance(decisions, Decisions):
        raise InputError(f"policy {name!r} returned {type(decisions).__name__} for a trial round, not Decisions",
                         field=flag)
