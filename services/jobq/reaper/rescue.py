"""The reaper's rescue duties (River's job rescuer): cut the leases of
workers whose database session ended to their queue's grace, and requeue
(or fail as a job of death) active jobs whose lease lapsed. The statements
and the rule of who is charged are in ``queries.sql`` (``workers_vanished``,
``requeue_lapsed``); this module runs them and says what they did, one log
line a job.
"""

from __future__ import annotations

import logging

from jobq.reaper.store import ReaperStore
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


async def cut_vanished(store: ReaperStore) -> list[str]:
    """Cut the leases of workers whose session ended; their ids."""
    out = []
    for w in await store.cut_vanished():
        out.append(w.worker_id)
        log.warning("worker %s vanished (its database session ended): %d lease(s) cut to "
                    "the grace period", w.worker_id, w.jobs,
                    extra=fields(event="worker_vanished", worker=w.worker_id))
    return out


async def requeue_lapsed(store: ReaperStore, batch: int,
                         reaper_id: str) -> tuple[list[str], list[str]]:
    """Requeue every lapsed lease, ``batch`` at a time; (requeued, failed) ids."""
    requeued: list[str] = []
    failed: list[str] = []
    while True:
        rows = await store.requeue_lapsed(batch, reaper_id)
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
            return requeued, failed
