"""The reapers' relay: publish the ids of rows nobody is known to have
published (SQL-only enqueues, requeues, retries and delayed jobs that fell
due, rows whose producer died before publishing, released dependants).

Rows are taken ``FOR UPDATE SKIP LOCKED`` inside a transaction that stays
open until the broker confirmed, so two reapers never publish the same row
at once and a consumer that gets the id early waits for the row lock instead
of missing the row. Dying in between only costs a duplicate message.
"""

from __future__ import annotations

import logging
import time

import asyncpg

from jobq.amqp.broker import Broker
from jobq.db import execute, fetch, transaction
from jobq.runtime import crash
from jobq.sql import Q

log = logging.getLogger("jobq.relay")

RETRY_LATER_S = 5.0  # a row the broker would not take is tried again after this


async def relay_due(broker: Broker, pool: asyncpg.Pool, batch_size: int,
                    budget_s: float | None = None) -> int:
    """Publish due rows nobody is known to have published; returns how many.
    With ``budget_s``, no new batch starts after that long: a backlog of
    seconds of broker work (a bulk enqueue, rows written while the broker
    was away) must not keep a reaper from its requeues; the probe still
    says relay_due, and the reaper's loop comes straight back for the rest."""
    total = 0
    stop_at = None if budget_s is None else time.monotonic() + budget_s
    while stop_at is None or time.monotonic() < stop_at:
        async with transaction(pool) as conn:
            rows = await fetch(conn, Q["relay_take"], batch_size)
            if not rows:
                return total
            # Raises if nothing could be sent at all (the broker is away): the
            # transaction rolls back and the next sweep tries again.
            confirmed = await broker.publish([(r["id"], r["queue"]) for r in rows])
            crash.point("reaper.mid_relay")
            await execute(conn, Q["relay_mark"], list(confirmed))
            missed = [r["id"] for r in rows if r["id"] not in confirmed]
            if missed:
                await execute(conn, Q["relay_defer"], missed, RETRY_LATER_S)
        total += len(confirmed)
        log.debug("relayed %d id(s)", len(confirmed))
        if len(rows) < batch_size or missed:
            return total
    return total
