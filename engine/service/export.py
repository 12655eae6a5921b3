"""The live service's workload as a trace (``arena export-trace``): every job ever
submitted to a service's state database, in our trace format, so that the same workload
can be replayed offline under every policy (``arena simulate`` / ``arena bench policies
--cluster FILE --trace FILE``).

What carries over: model (a ``config.json`` model by the path of the service's frozen
copy), global batch, steps, gpu type and count asked for, priority, tenant, and the
deadline, relative to the submission. Arrivals are the submission times, the first at 0.
What does not: how the jobs ran. A replay's truth is the simulator's oracle (for the GPU
types of the Arena table, its measurements), not the iteration times the service
measured; jobs that were cancelled or failed live are replayed to their last step, like
every job, and a job that ran after others (``after``) arrives at its submission, since
the trace format has no dependencies (``arena export-trace`` counts both on stderr).
"""
from __future__ import annotations

import math
import sqlite3
from collections import Counter

from instances.errors import InputError
from instances.jobs import Job
from instances.limits import is_number

from .jobspec import JobSpec
from .store import JOB_STATUSES, Store
from .store.rows import JobRow

RESTORE = "restore the state from a backup (`arena backup`; docs/operators.md)"


def job_rows(store: Store, label: str) -> list[JobRow]:
    """Every job's row, or an ``InputError`` naming the database ``label`` and what in it
    cannot be read: a missing or damaged table, or the job whose stored spec is not JSON."""
    try:
        return store.jobs.rows()
    except sqlite3.DatabaseError as e:
        raise InputError(f"its jobs cannot be read ({e}): a damaged database, or not a service's; {RESTORE}",
                         file=label, field="jobs") from None
    except (ValueError, TypeError):         # a spec that is not a JSON object
        for status in JOB_STATUSES:
            for i in store.jobs.ids(status):
                try:
                    store.jobs.rows(ids=[i])
                except (ValueError, TypeError) as e:
                    raise InputError(f"job {i}: its stored spec is not a JSON object ({e}); {RESTORE}",
                                     file=label, field="jobs.spec") from None
        raise InputError(f"a job's stored spec or status cannot be read; {RESTORE}", file=label,
                         field="jobs") from None


def workload(store: Store, label: str) -> tuple[list[Job], Counter]:
    """Every submitted job as a trace job (id ``<service id>-<name>``, arrival = seconds
    after the first submission), and the jobs' live statuses counted. ``label`` names the
    database in errors."""
    rows = job_rows(store, label)
    if not rows:
        raise InputError("no job was ever submitted to this service", file=label)
    for r in rows:
        if not (is_number(r.submitted_at) and math.isfinite(r.submitted_at)):
            raise InputError(f"job {r.id}: its submission time {r.submitted_at!r} is not a time; {RESTORE}",
                             file=label, field="jobs.submitted_at")
    t0 = min(r.submitted_at for r in rows)
    jobs = [JobSpec.from_dict(r.spec, source=f"{label}, job {r.id}", check_files=False)
            .to_job(f"{r.id}-{r.name}", r.submitted_at - t0)
            for r in sorted(rows, key=lambda r: (r.submitted_at, r.id))]
    return jobs, Counter(r.status for r in rows)
