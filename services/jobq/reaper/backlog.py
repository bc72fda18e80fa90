"""The backlog as gauges: what is queued, per queue and state, and how long
the oldest ready job has waited.

Every reaper samples ``jobq.backlog`` (schema 0030) on its own clock and
exports ``jobq_queue_depth{queue,state}``,
``jobq_queue_oldest_wait_seconds{queue}``, and the suspended jobs by what
they wait for, ``jobq_queue_suspended{queue,reason}`` and
``jobq_queue_oldest_suspended_seconds{queue}`` (issue #52); reapers are peers, so each shows
the same figures and alert rules take ``max by``. The statement reads queued
rows only and runs under a statement timeout: a backlog too large to count
in time costs a missed sample (logged), never a sweep. A queue deleted since
the last sample loses its series, so a dropped queue does not alert forever.
"""

from __future__ import annotations

import logging
import time

from jobq.reaper.store import ReaperStore
from jobq.rows import Backlog
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.reaper")


class BacklogGauges:
    def __init__(self) -> None:
        self._queues: set[str] = set()  # the queues whose series are exported

    async def sample(self, store: ReaperStore, timeout_s: float) -> list[Backlog] | None:
        """Refresh the gauges; the rows, or None when the sample failed."""
        try:
            rows = await store.backlog(timeout_s)
        except Exception as exc:  # a timeout, the database away: the next sample
            log.warning("backlog sample failed: %s: %s; the gauges keep the last one",
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                        extra=fields(event="backlog_sample_failed"))
            return None
        seen = set()
        for row in rows:
            seen.add(row.queue)
            for state in Backlog.STATES:
                metrics.QUEUE_DEPTH.labels(row.queue, state).set(getattr(row, state))
            metrics.OLDEST_WAIT.labels(row.queue).set(row.oldest_ready_s)
            for reason in Backlog.REASONS:
                metrics.SUSPENDED.labels(row.queue, reason).set(
                    getattr(row, f"suspended_{reason}"))
            metrics.OLDEST_SUSPENDED.labels(row.queue).set(row.oldest_suspended_s)
        for gone in self._queues - seen:
            for state in Backlog.STATES:
                metrics.QUEUE_DEPTH.remove(gone, state)
            for reason in Backlog.REASONS:
                metrics.SUSPENDED.remove(gone, reason)
            metrics.OLDEST_WAIT.remove(gone)
            metrics.OLDEST_SUSPENDED.remove(gone)
        self._queues = seen
        metrics.BACKLOG_SAMPLED.set(time.time())
        return rows
