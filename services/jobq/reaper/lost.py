"""Messages the broker lost: found from the rows and published again.

RabbitMQ can lose ids it confirmed (a purge, a classic queue lost in a
restart, ids dead-lettered past a delivery limit, a claim lost in an
asynchronous failover). The row is the truth: a row published a while ago
and still ``queued`` has lost its message when the broker queue is empty,
or when consumers already started jobs published well after it (a queue
delivers in order; see ``lost_horizon`` in queries.sql). Such rows go back
to the relay. A row whose message was in fact only held up (a busy or
frozen consumer's prefetch, a requeue) costs a duplicate id, which
consumers drop. Every statement is bounded by what runs, not by a backlog.
"""

from __future__ import annotations

import logging

from jobq.reaper.store import ReaperStore
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.reaper")


async def republish_lost(store: ReaperStore, after_s: float) -> int:
    """Hand rows published over ``after_s`` before their horizon and still
    waiting back to the relay; returns how many."""
    total = 0
    for queue in await store.lost_candidates(after_s):
        n = await store.republish_lost(queue, after_s)
        if not n:
            continue
        total += n
        metrics.SWEEP_ROWS.labels("republished_lost").inc(n)
        # What the check knows, not more: usually a consumer crashed with
        # these ids prefetched, not a broker fault. Not an alarm.
        log.info("queue %s: %d job(s) published over %.0fs ago have not started (their "
                 "broker queue is empty, or jobs published after them have started); "
                 "republishing their ids (a consumer drops a duplicate)", queue, n, after_s,
                 extra=fields(event="republish_lost", queue=queue))
    return total
