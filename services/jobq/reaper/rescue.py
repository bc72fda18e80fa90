"""The reaper's rescue duties (River's job rescuer): cut the leases of
workers whose database session ended to their queue's grace, and requeue
(or fail as a job of death) active jobs whose lease lapsed. The statements
and the rule of who is charged are in ``queries.sql`` (``workers_vanished``,
``requeue_lapsed``); this module runs them and says what they did, one log
line a job.
"""

from __future__ import annotations

import logging

import asyncpg

from jobq import lease
from jobq.status import Status
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.reaper")

# requeue_lapsed's verdicts, for the log line (the rule is in queries.sql).
VERDICT = {"own": "charged a stall: it ran alone or isolated",
           "witness": "not charged: its worker died holding several jobs",
           "bystander": "not charged: its worker was isolating another job (noted as "
                        "present: a second such crash makes it a suspect)",
           "parent": "not charged: its worker ran handlers in child processes, and a "
                     "handler's crash would have killed only its child"}


async def cut_vanished(pool: asyncpg.Pool | None, vanished: list[str]) -> None:
    """Cut the leases of workers whose session ended; their ids go to ``vanished``."""
    assert pool is not None
    for w in await lease.cut_vanished(pool):
        vanished.append(w.worker_id)
        log.warning("worker %s vanished (its database session ended): %d lease(s) cut to "
                    "the grace period", w.worker_id, w.jobs,
                    extra=fields(event="worker_vanished", worker=w.worker_id))


async def requeue_lapsed(pool: asyncpg.Pool | None, batch: int, reaper_id: str,
                         requeued: list[str], failed: list[str]) -> None:
    """Requeue every lapsed lease, ``batch`` at a time; ids go to the lists."""
    assert pool is not None
    while True:
        rows = await lease.requeue_lapsed(pool, batch, reaper_id)
        for r in rows:
            if r.status == Status.FAILED:
                metrics.JOBS_OF_DEATH.labels(r.queue).inc()
                failed.append(str(r.id))
                log.warning("job of death: lease lapsed %d times; failed", r.stalls,
                            extra=fields(event="failed", job=r.id, queue=r.queue,
                                         worker=r.worker_id, stalls=r.stalls))
            else:
                metrics.JOBS_STALLED.labels(r.queue).inc()
                requeued.append(str(r.id))
                log.info("lease lapsed; requeued (%s)", VERDICT[r.verdict],
                         extra=fields(event="stalled", job=r.id, queue=r.queue,
                                      worker=r.worker_id, stalls=r.stalls,
                                      suspect_stalls=r.suspect_stalls))
        if len(rows) < batch:
            break
