"""Periodic jobs: a schedule enqueues a job per slot, exactly once per slot
whatever number of reapers run (issue #17).

A schedule is a cron expression (five fields, in an IANA time zone; parsed
by cronsim, DST handled) or an interval in seconds, plus a queue and a
payload. It lives in ``jobq.schedule``; apps declare schedules
(``@app.periodic`` / ``app.schedule``) and consumers store them at start
through a narrow path (``schedule_upsert``: the login must also be a
producer, and a schedule an operator set is never touched); operators use
``jobq schedule set|list|delete`` or SQL, and their word wins.

One schedule never holds up the others: a slot that cannot be fired (its
payload is over the queue's limit, its cron no longer parses) is recorded on
its row (``last_error``) and stepped over, with one log line; only an
outage of the database stops the sweep's schedules.

Exactly once: every reaper sweep reads the due schedules and fires each in
one short transaction: it takes the schedule's row lock (a schedule another
reaper holds is left to it, never waited for), then ``schedule_fire``
re-checks that ``next_run_at`` is still the slot this reaper read, enqueues
the job and advances ``next_run_at``. A second
reaper reading the same slot finds it advanced and fires nothing; the job's
idempotency key ``schedule:<name>:<slot>`` would refuse a second job anyway.
No leader to elect, so nothing to split.

Missed slots (no reaper ran): one run at catch-up, labelled with the first
missed slot, then the next slot after now, as Celery beat, Oban and River do
by default; ``jobq schedule backfill`` enqueues the others when they are
wanted (each slot once, however often it is run). Overlap ``skip`` never
puts a second job of a schedule in line while one is queued or running:
the slot is skipped and recorded (schema 0034). All times come from the
database clock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg
from cronsim import CronSim, CronSimError

from jobq.errors import BadInput

log = logging.getLogger("jobq.schedules")

OVERLAPS = ("allow", "skip")
MAX_BACKFILL = 10_000  # slots one backfill may enqueue



@dataclass(frozen=True)
class Schedule:
    name: str
    queue: str
    payload: Any = None
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    enabled: bool = True
    overlap: str = "allow"  # or "skip": no slot enqueues while its last job is live

    def __post_init__(self) -> None:
        from jobq.queues import QUEUE_NAME

        for what, value in (("schedule name", self.name), ("queue", self.queue)):
            if not isinstance(value, str) or not QUEUE_NAME.fullmatch(value):
                raise BadInput(f"invalid {what} {value!r}: use 1-100 letters, digits, _ . : -")
        if self.overlap not in OVERLAPS:
            raise BadInput(f"schedule {self.name}: unknown overlap {self.overlap!r} "
                           f"(use {' or '.join(OVERLAPS)})")
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
            if len(self.cron.split()) != 5:
                raise BadInput(f"schedule {self.name}: cron {self.cron!r} must have five "
                               "fields (minute hour day-of-month month day-of-week)")
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

    def slots_between(self, start: datetime, end: datetime, anchor: datetime) -> list[datetime]:
        """Every slot from ``start`` to ``end`` (both included), at most
        MAX_BACKFILL; interval slots on the lattice through ``anchor`` (the
        schedule's next slot), as the reapers fire them."""
        out: list[datetime] = []
        t = self.next_after(start - timedelta(microseconds=1), anchor)
        while t <= end:
            if len(out) == MAX_BACKFILL:
                raise BadInput(f"schedule {self.name}: more than {MAX_BACKFILL} slots from "
                               f"{start.isoformat()} to {end.isoformat()}; backfill a "
                               "shorter range at a time")
            out.append(t)
            t = self.next_after(t, anchor)
        return out

    def row(self, now: datetime) -> tuple[Any, ...]:
        """Arguments of schedule_upsert, next slot computed from ``now``."""
        return (self.name, self.queue, json.dumps(self.payload if self.payload is not None
                                                  else {}), self.cron, self.timezone,
                self.every_s, self.next_after(now, now), self.enabled)


@contextlib.contextmanager
def refused(name: str) -> Iterator[None]:
    """A schedule the database refuses on its data (SQLSTATE 22/23) is bad input."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        if (exc.sqlstate or "")[:2] not in ("22", "23"):
            raise
        from jobq.db import pg_message

        raise BadInput(pg_message(exc)) from None
