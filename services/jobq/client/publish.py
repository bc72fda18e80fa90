"""Publishing ids of committed rows, then marking them published.

:func:`publish_and_mark` runs on the caller's path (a producer right after
its commit, a consumer releasing jobs, a child death requeued): publish,
then mark the confirmed rows published. Any failure leaves rows unmarked and
the reapers' relay (``reaper/relay.py``, the other writer of
``published_at``) publishes them later: a crash between confirm and mark
costs a duplicate message (consumers drop it), never a job.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import asyncpg

from jobq.amqp.broker import Broker
from jobq.client import store

log = logging.getLogger("jobq.client.publish")



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


async def publish_ids(broker: Broker, items: Sequence[tuple[uuid.UUID, str]],
                      per_message: int | None = None) -> set[uuid.UUID]:
    """The ids the broker confirmed; none (logged) if it is away. Never raises.
    ``per_message``: as ``Broker.publish`` (spread by default)."""
    if not items:
        return set()
    try:
        return await broker.publish(items, per_message)
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
        await store.mark(pool, rows, own_spells)
    except Exception as exc:
        log.warning("published %d id(s), but could not mark them published (%s); the reaper "
                    "will publish them again (a harmless duplicate)", len(rows), exc)
