"""Operator actions on schedules (``jobq schedule set|list|trigger|backfill|
delete``), usable from Python too (``jobq.ops.admin`` re-exports them): each
takes a pool, runs named statements and returns rows or raises BadInput."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from jobq.db import Database, execute, fetch, fetchrow, now, transaction
from jobq.errors import BadInput
from jobq.schedules import Schedule, refused
from jobq.sql import Q


async def set_schedule(db: Database, schedule: Schedule, *,
                       keep_overlap: bool = False) -> None:
    """Create or change a schedule (``jobq schedule set``); an unchanged one
    keeps its next slot (and its overlap, with ``keep_overlap``). BadInput if
    the database refuses it (a payload over the queue's limit: a trigger
    checks it)."""
    at = await now(db)
    with refused(schedule.name):
        await execute(db, Q["schedule_set"], *schedule.row(at),
                      None if keep_overlap else schedule.overlap)


async def trigger_schedule(pool: asyncpg.Pool, name: str) -> uuid.UUID:
    """One job of schedule ``name`` now, its slots unchanged; its id. Under
    overlap skip, BadInput naming the live job while one is queued or running."""
    with refused(name):
        async with transaction(pool) as conn:
            await execute(conn, Q["schedule_lock"], name)
            row = await fetchrow(conn, Q["schedule_trigger"], name)
    if row is None:
        raise BadInput(f"no schedule named {name!r} (jobq schedule list shows them)")
    if row["live"]:
        raise BadInput(f"schedule {name} has overlap skip and its job {row['id']} is still "
                       "queued or running: nothing enqueued (wait for it, or jobq cancel it)")
    job_id: uuid.UUID = row["id"]
    return job_id


async def backfill_schedule(pool: asyncpg.Pool, name: str, start: datetime,
                            end: datetime) -> list[Any]:
    """A job for each slot of schedule ``name`` from ``start`` to ``end``
    (both included, not past now) that has none yet; the (slot, id) rows made.
    Run twice, the second makes nothing."""
    if start.tzinfo is None or end.tzinfo is None:
        raise BadInput("give --from and --to with a time zone (e.g. 2026-12-01T00:00Z)")
    if end < start:
        raise BadInput("--to is before --from")
    got = await fetchrow(pool, Q["schedule_get"], name)
    if got is None:
        raise BadInput(f"no schedule named {name!r} (jobq schedule list shows them)")
    if end > got["now"]:
        raise BadInput(f"--to is in the future ({end.isoformat()}): the schedule fires its "
                       "own coming slots; backfill up to now")
    s = Schedule(got["name"], got["queue"], None, got["cron"], got["interval_s"],
                 got["timezone"])
    slots = s.slots_between(start, end, got["next_run_at"])
    with refused(name):
        async with transaction(pool) as conn:
            await execute(conn, Q["schedule_lock"], name)
            return await fetch(conn, Q["schedule_backfill"], name, slots)


async def delete_schedule(pool: asyncpg.Pool, name: str) -> None:
    if not await fetch(pool, Q["schedule_delete"], name):
        raise BadInput(f"no schedule named {name!r}")


async def schedules(pool: asyncpg.Pool) -> list[Any]:
    return await fetch(pool, Q["schedule_list"])
