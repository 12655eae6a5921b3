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

from collections import Counter

from instances.errors import InputError
from instances.jobs import Job

from .jobspec import JobSpec
from .store import Store


def workload(store: Store, label: str) -> tuple[list[Job], Counter]:
    """Every submitted job as a trace job (id ``<service id>-<name>``, arrival = seconds
    after the first submission), and the jobs' live statuses counted. ``label`` names the
    database in errors."""
    rows = store.jobs.rows()
    if not rows:
        raise InputError("no job was ever submitted to this service", file=label)
    t0 = min(r.submitted_at for r in rows)
    jobs = [JobSpec.from_dict(r.spec, source=f"{label}, job {r.id}", check_files=False)
            .to_job(f"{r.id}-{r.name}", r.submitted_at - t0)
            for r in sorted(rows, key=lambda r: (r.submitted_at, r.id))]
    return jobs, Counter(r.status for r in rows)
