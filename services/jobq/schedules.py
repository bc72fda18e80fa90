"""Periodic jobs: a schedule enqueues a job per slot, exactly once per slot
whatever number of reapers run (issue #17).

A schedule is a cron expression (five fields, in an IANA time zone; parsed
by cronsim, DST handled) or an interval in seconds, plus a queue and a
payload. It lives in ``jobq.schedule``; apps declare schedules
(``@app.periodic`` / ``app.schedule``) and consumers upsert them at start,
operators use ``jobq schedule set|list|delete`` or SQL.

Exactly once: every reaper sweep reads the due schedules and fires each with
one conditional statement (``schedule_fire``): it locks the schedule row,
re-checks that ``next_run_at`` is still the slot this reaper read, enqueues
the job and advances ``next_run_at`` in the same transaction. A second
reaper reading the same slot finds it advanced and fires nothing; the job's
idempotency key ``schedule:<name>:<slot>`` would refuse a second job anyway.
No leader to elect, so nothing to split.

Missed slots (no reaper ran): one run at catch-up, labelled with the first
missed slot, then the next slot after now, as Celery beat, Oban and River do
by default. All times come from the database clock.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobq.errors import BadInput
from jobq.logs import fields

log = logging.getLogger("jobq.schedules")

FIRE_BATCH = 100  # due schedules read per sweep


@dataclass(frozen=True)
class Schedule:
    name: str
    queue: str
    payload: Any = None
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    enabled: bool = True

    def __post_init__(self) -> None:
        from jobq.app import QUEUE_NAME

        for what, value in (("schedule name", self.name), ("queue", self.queue)):
            if not isinstance(value, str) or not QUEUE_NAME.fullmatch(value):
                raise BadInput(f"invalid {what} {value!r}: use 1-100 letters, digits, _ . : -")
        if (self.cron is None) == (self.every_s is None):
            raise BadInput(f"schedule {self.name}: give a cron expression or an interval, "
                           "not both and not neither")
        if self.every_s is not None and not (1 <= self.every_s < 31536000):
            raise BadInput(f"schedule {self.name}: the interval must be 1 s to a year")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise BadInput(f"schedule {self.name}: unknown time zone {self.timezone!r} "
                           "(use an IANA name such as Europe/Berlin)") from None
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime.now(ZoneInfo(self.timezone)))
            except CronSimError as exc:
                raise BadInput(f"schedule {self.name}: bad cron expression {self.cron!r}: "
                               f"{exc}") from None
        json.dumps(self.payload)  # TypeError: not JSON

    def next_after(self, t: datetime, anchor: datetime | None = None) -> datetime:
        """The first slot strictly after ``t`` (interval slots count from ``anchor``)."""
        if self.every_s is not None:
            base = anchor or t
            k = math.floor((t - base).total_seconds() / self.every_s) + 1
            return base + timedelta(seconds=k * self.every_s)
        assert self.cron is not None
        local = t.astimezone(ZoneInfo(self.timezone))
        nxt: datetime = next(iter(CronSim(self.cron, local)))
        return nxt

    def row(self, now: datetime) -> tuple[Any, ...]:
        """Arguments of schedule_upsert, next slot computed from ``now``."""
        return (self.name, self.queue, json.dumps(self.payload if self.payload is not None
                                                  else {}), self.cron, self.timezone,
                self.every_s, self.next_after(now, now), self.enabled)


def from_row(r: Any) -> Schedule:
    return Schedule(r["name"], r["queue"], None, r["cron"], r["interval_s"], r["timezone"],
                    r["enabled"])


async def upsert(conn: Any, schedules: list[Schedule]) -> None:
    """Create or change schedules; an unchanged one keeps its next slot."""
    from jobq.sql import Q

    now = await conn.fetchval("SELECT now()")
    for s in schedules:
        await conn.execute(Q["schedule_upsert"], *s.row(now))


async def fire_due(pool: Any) -> int:
    """Reaper: enqueue every due slot (once per slot); returns jobs enqueued."""
    from jobq.db import connection
    from jobq.sql import Q

    fired = 0
    async with connection(pool) as conn:
        due = await conn.fetch(Q["schedules_due"], FIRE_BATCH)
        for r in due:
            s = from_row(r)
            # Catch-up: one run for every slot missed up to now.
            nxt = s.next_after(r["now"], r["next_run_at"])
            job_id = await conn.fetchval(Q["schedule_fire"], s.name, r["next_run_at"], nxt)
            if job_id is not None:
                fired += 1
                late = (r["now"] - r["next_run_at"]).total_seconds()
                log.info("schedule %s fired", s.name, extra=fields(
                    event="scheduled", job=job_id, queue=s.queue, late_s=round(late, 3)))
    return fired
