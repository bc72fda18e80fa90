"""The reapers' periodic duty: fire every schedule whose slot has come,
once per slot, whatever the number of reapers (``schedule_fire`` enqueues
only if the slot it read is still the schedule's next one, under the
schedule's row lock). What a schedule is, and how it is declared, is
``schedules.py``; this is only the firing."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime

import asyncpg

from jobq.db import PooledConnection, connection, execute, fetch, fetchval, is_transient
from jobq.rows import of
from jobq.schedules import Schedule
from jobq.sql import Q
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.schedules")

FIRE_BATCH = 100  # due schedules read per sweep


@dataclasses.dataclass(frozen=True, slots=True)
class DueSlot:
    """A schedule whose next slot has come (schedules_due), with the
    database clock's now."""

    name: str
    queue: str
    cron: str | None
    interval_s: float | None
    timezone: str
    enabled: bool
    next_run_at: datetime
    now: datetime

    def schedule(self) -> Schedule:
        return Schedule(self.name, self.queue, None, self.cron, self.interval_s, self.timezone,
                        self.enabled)


async def fire_due(pool: asyncpg.Pool) -> int:
    """Enqueue every due slot (once per slot); returns jobs enqueued. A slot
    that cannot be fired is recorded and stepped over (``_skip``); a lost
    connection is raised (the sweep tries again)."""
    fired = 0
    async with connection(pool) as conn:
        due = [of(DueSlot, r) for r in await fetch(conn, Q["schedules_due"], FIRE_BATCH)]
        for d in due:
            try:  # one statement, autocommitted: a reaper frozen after it holds no lock
                job_id = await _fire(conn, d)
            except Exception as exc:
                if is_transient(exc) or conn.is_closed():
                    raise
                await _skip(conn, d, exc)
                continue
            if job_id is not None:
                fired += 1
                late = (d.now - d.next_run_at).total_seconds()
                log.info("schedule %s fired", d.name, extra=fields(
                    event="scheduled", job=job_id, queue=d.queue, late_s=round(late, 3)))
    return fired


async def _fire(conn: PooledConnection, d: DueSlot) -> uuid.UUID | None:
    # Catch-up: one run for every slot missed up to now.
    nxt = d.schedule().next_after(d.now, d.next_run_at)
    job_id: uuid.UUID | None = await fetchval(conn, Q["schedule_fire"], d.name, d.next_run_at,
                                              nxt)
    return job_id


async def _skip(conn: PooledConnection, d: DueSlot, exc: BaseException) -> None:
    """Record why the slot was not fired and step over it (disable the
    schedule if no next slot can be computed)."""
    try:
        nxt: datetime | None = d.schedule().next_after(d.now, d.next_run_at)
    except Exception:
        nxt = None
    why = (str(exc) or type(exc).__name__)[:1000]
    await execute(conn, Q["schedule_skip"], d.name, d.next_run_at, nxt, why)
    log.warning("schedule %s: slot %s not fired: %s; %s", d.name, d.next_run_at.isoformat(),
                why, f"next slot {nxt.isoformat()}" if nxt else "schedule disabled",
                extra=fields(event="schedule_failed", queue=d.queue))
