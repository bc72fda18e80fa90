"""Typed rows: what the worker's and the reaper's statements return.

The gateway (``db.py``) hands out driver records; ``lease.py``, the relay
and the reaper's duties turn the ones they use into these small frozen
values at once, so no code past them indexes a row by a string and mypy
knows every field. Each class names the statement(s) of ``queries.sql``
it reads; :func:`of` takes exactly the fields the class declares, so a
column renamed in the SQL fails at the first row, not later in a log call.
"""

from __future__ import annotations

import dataclasses
import operator
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import asyncpg

R = TypeVar("R")


def of(cls: type[R], row: asyncpg.Record | Mapping[str, Any]) -> R:
    """``cls`` from a record (or a dict) with at least its fields. On the
    claim's path once per job: the fields are read by one cached itemgetter
    (2.8 us a Claim against 4.1 us for a generator over the names). Every
    row here has two fields or more: itemgetter of one name returns no tuple."""
    get = _GETTERS.get(cls)
    if get is None:
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) \
            else list(cls._fields)  # type: ignore[attr-defined]  # a NamedTuple
        assert len(names) > 1, cls
        get = _GETTERS[cls] = operator.itemgetter(*names)
    return cls(*get(row))


_GETTERS: dict[type[Any], operator.itemgetter[Any]] = {}


class Spell(NamedTuple):
    """A queued spell to publish: the job, its queue and the spell's token
    (None for a row just inserted). release, unpark_freed, retry_failed,
    child_died's requeue, a claim's hand-back."""

    id: uuid.UUID
    queue: str
    lock: uuid.UUID | None


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """One claimed job (claim, claim_recover): the run's inputs. ``via``
    is the delivered id it was claimed for (another job's when a higher
    priority took the delivered one's place)."""

    id: uuid.UUID
    queue: str
    lock: uuid.UUID
    payload: str
    attempts: int
    stalls: int
    created_at: datetime
    suspect: bool
    handoffs: int
    lease_s: float
    timeout_s: float | None
    vanished_grace_s: float
    max_result_bytes: int
    limited: bool
    via: uuid.UUID


@dataclasses.dataclass(frozen=True)
class Renewal:
    """What one renewal statement did (renew): the leases it extended, and
    those it left alone because another transaction held their row right
    then (still ours: tried again soon). A lease in neither is lost;
    ``cancelled``: of those, the ones cancelled under their run."""

    renewed: frozenset[uuid.UUID]
    busy: frozenset[uuid.UUID] = frozenset()
    cancelled: frozenset[uuid.UUID] = frozenset()


class Claimed(NamedTuple):
    """What one claim did (``claim``): per delivered id, the row it brought
    (its own job, or a higher-priority job's in its place) or None; and the
    spells of delivered jobs a higher priority overtook, back in line, which
    the caller publishes again."""

    rows: list[Claim | None]
    handed: list[Spell]


@dataclasses.dataclass(frozen=True, slots=True)
class Miss:
    """Why a delivered id was not claimable (claim_misses)."""

    id: uuid.UUID
    queue: str
    status: str
    not_due: bool
    parked: bool
    expired: bool  # unstarted past its deadline (schema 0031): the reapers cancel it


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    """A recorded handler failure (fail): queued again (a retry in
    ``retry_in_s``; None when a retried write found its own earlier one)
    or failed for good."""

    id: uuid.UUID
    status: str
    retry_in_s: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class ChildDeath:
    """A child process's death charged to its job (child_died): requeued
    (published at once when ``due``) or failed as a job of death."""

    id: uuid.UUID
    queue: str
    lock: uuid.UUID
    status: str
    stalls: int
    due: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Lapsed:
    """A lapsed lease the reaper moved (requeue_lapsed), with the verdict of
    who was charged."""

    id: uuid.UUID
    queue: str
    status: str
    stalls: int
    suspect_stalls: int
    verdict: str
    worker_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Vanished:
    """A worker whose registry session ended, and how many leases were cut
    (workers_vanished)."""

    worker_id: str
    jobs: int


@dataclasses.dataclass(frozen=True, slots=True)
class Backlog:
    """One queue's queued jobs by state and its oldest ready job's wait
    (jobq.backlog, schema 0030); the suspended ones by reason and the oldest
    suspension's age (schema 0038)."""

    queue: str
    ready: int
    delayed: int
    waiting: int
    parked: int
    suspended: int
    oldest_ready_s: float
    suspended_sleep: int
    suspended_signal: int
    suspended_children: int
    oldest_suspended_s: float

    STATES = ("ready", "delayed", "waiting", "parked", "suspended")
    REASONS = ("sleep", "signal", "children")  # suspended_<reason>


@dataclasses.dataclass(frozen=True, slots=True)
class Overdue:
    """Leases past their deadline that no reaper has moved yet (reaper_swept)."""

    overdue_leases: int
    oldest_overdue_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """Which of a sweep's duties have anything to do, and the seconds to the
    next deadline, relay time or slot, None if nothing is pending (sweep_probe)."""

    active: bool
    vanished: bool
    parked: bool
    relay_due: bool
    schedules_due: bool
    seconds: float | None
    min_lease_s: float | None = None  # the shortest queue lease (None: no queue)
    dependants: bool = False  # new edges, or ended jobs with dependants to settle
    signals: bool = False  # signals no wake or read saw yet (issue #52)
    expiring: bool = False  # unstarted jobs past their deadline (schema 0031)
    superseding: bool = False  # keys of latest queues with a new job (schema 0042)

    @property
    def idle(self) -> bool:
        return not (self.active or self.vanished or self.parked or self.relay_due
                    or self.schedules_due or self.dependants or self.signals
                    or self.superseding)

    def sleep_s(self, max_s: float, slack_s: float, idle_s: float | None = None) -> float:
        """How long the reaper may sleep: until then (plus slack), at most
        max_s; when idle and ``idle_s`` is given, at most ``idle_s`` instead,
        but never past the shortest lease (a job claimed after this probe
        lapses no sooner than that) nor under max_s (reaper/wakes.py)."""
        cap = max_s
        if idle_s is not None and self.idle:
            lease = idle_s if self.min_lease_s is None else self.min_lease_s
            cap = max(max_s, min(idle_s, lease))
        return cap if self.seconds is None else max(0.02, min(cap, self.seconds + slack_s))


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


@dataclasses.dataclass(frozen=True, slots=True)
class Superseded:
    """What one call of the supersede duty did (supersede_pending): jobs
    cancelled, and ``more``: it took as many notes as it may, so more may
    wait (a note names a key, and most keys have nothing to cancel)."""

    cancelled: int
    more: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Settled:
    """What one call of the dependants duty did (settle_dependants); ``more``:
    it stopped at its bound with work left."""

    released: int
    cancelled: int
    more: bool
