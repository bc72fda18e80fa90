"""Publishing ids of committed rows, and the one writer of ``published_at``.

Two ways an id reaches the broker, both here:

- :func:`publish_and_mark`, on the caller's path (producer right after its
  commit, a consumer releasing jobs, a child death requeued): publish, then
  mark the confirmed rows published. Any failure leaves rows unmarked and
  :func:`relay_due` publishes them later: a crash between confirm and mark
  costs a duplicate message (consumers drop it), never a job.
- :func:`relay_due`, the reapers' relay: rows nobody is known to have
  published, taken ``FOR UPDATE SKIP LOCKED`` inside a transaction that
  stays open until the broker confirmed, so two reapers never publish the
  same row at once and a consumer that gets the id early waits for the row
  lock instead of missing the row.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

import asyncpg

from jobq import crash
from jobq.broker import Broker
from jobq.db import execute, fetch, transaction
from jobq.sql import Q

log = logging.getLogger("jobq.relay")

RETRY_LATER_S = 5.0  # a row the broker would not take is tried again after this


async def publish_and_mark(broker: Broker, pool: asyncpg.Pool,
                           rows: Sequence[tuple[uuid.UUID, str, uuid.UUID | None]],
                           *, own_spells: bool = False) -> int:
    """Publish committed rows' ids (id, queue, lock token of their queued
    spell: NULL for a new row), then mark the confirmed ones; returns how
    many the broker confirmed. Never raises: the relay is the fallback.
    ``own_spells``: a consumer's republish of spells whose tokens it made
    (release, unpark), marked by ``mark_republished``."""
    confirmed = await publish_ids(broker, [(i, q) for i, q, _ in rows])
    locks = {i: lk for i, _, lk in rows}
    await mark(pool, [(i, locks[i]) for i in confirmed], own_spells=own_spells)
    return len(confirmed)


async def publish_ids(broker: Broker, items: Sequence[tuple[uuid.UUID, str]]) -> set[uuid.UUID]:
    """The ids the broker confirmed; none (logged) if it is away. Never raises."""
    if not items:
        return set()
    try:
        return await broker.publish(items)
    except Exception as exc:
        log.warning("could not publish %d id(s) now (%s); the reaper will publish them",
                    len(items), exc)
        return set()


async def mark(pool: asyncpg.Pool, rows: Sequence[tuple[uuid.UUID, uuid.UUID | None]],
               *, own_spells: bool = False) -> None:
    """Mark confirmed ids published (id, lock token). Never raises: a missing
    mark only makes the relay publish the id once more, and consumers drop
    the duplicate."""
    if not rows:
        return
    try:
        await execute(pool, Q["mark_republished" if own_spells else "mark_published"],
                      [i for i, _ in rows], [lk for _, lk in rows])
    except Exception as exc:
        log.warning("published %d id(s), but could not mark them published (%s); the reaper "
                    "will publish them again (a harmless duplicate)", len(rows), exc)


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
