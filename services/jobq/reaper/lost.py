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

import asyncpg

from jobq.amqp.broker import Broker
from jobq.db import fetch, fetchval, translated
from jobq.sql import Q
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.reaper")


async def republish_lost(pool: asyncpg.Pool, broker: Broker, after_s: float) -> int:
    """Hand rows published over ``after_s`` before their horizon and still
    waiting back to the relay; returns how many."""
    with translated():
        candidates = await fetch(pool, Q["lost_candidates"], after_s)
    total = 0
    for row in candidates:
        queue = row["queue"]
        try:
            empty = await broker.ready_count(queue) == 0
        except Exception as exc:  # broker away: try again next time
            log.debug("ready count of %s: %r", queue, exc)
            continue
        with translated():
            before = await fetchval(pool, Q["lost_horizon"], queue, after_s, empty)
            if before is None:
                continue  # a backlog nobody has started on lately: nothing to tell
            n = int(await fetchval(pool, Q["unpublish_lost"], queue, before, empty))
        total += n
        metrics.SWEEP_ROWS.labels("republished_lost").inc(n)
        if n:
            # What the check knows, not more: usually a consumer crashed with
            # these ids prefetched, not a broker fault. Not an alarm.
            why = ("its broker queue is empty" if empty
                   else "jobs published after them have started")
            log.info("queue %s: %d job(s) published over %.0fs ago have not started and %s; "
                     "republishing their ids (a consumer drops a duplicate)", queue, n,
                     after_s, why, extra=fields(event="republish_lost", queue=queue))
    return total
