"""A fake :class:`jobq.worker.store.WorkerStore`, with the lease's rules:
every write by a worker is fenced by (id, lock token, status active, not
lapsed on the store's clock), a retried write recognises its own token, and
a miss says why. The clock is the event loop's, so a test sets 1 s leases
and waits on them. Faults are injected per statement: ``fail_next(name,
exc, ...)`` raises those, in order, on the next calls; ``lose_reply(name)``
applies the next call then raises (its reply lost).

What the fake does not model (the integration tests cover it): SQL itself,
priorities and limits, the reaper (``lapse()`` and ``requeue()`` stand in).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from jobq.errors import MAX_SNOOZES, DatabaseUnavailable
from jobq.lease import Failure, Lease
from jobq.rows import ChildDeath, Claim, Claimed, Failed, Miss, Renewal, Spell
from jobq.worker.steps import JobLink


@dataclasses.dataclass
class FakeRow:
    id: uuid.UUID
    queue: str
    payload: str = "{}"
    status: str = "queued"
    lock: uuid.UUID | None = None
    worker: str | None = None
    expires: float = 0.0  # loop time the lease lapses
    run_at: float = 0.0
    attempts: int = 0
    stalls: int = 0
    max_attempts: int = 3
    max_stalls: int = 2
    lease_s: float = 30.0
    grace_s: float = 2.0
    timeout_s: float | None = None
    limited: bool = False
    suspect: bool = False
    handoffs: int = 0
    isolated: bool = False
    result: str | None = None
    error: str | None = None
    progress: str | None = None
    poison: bool = False  # its claim raises a data error (SQLSTATE 22)
    locked: bool = False  # another transaction holds the row: renewals skip it (busy)
    snoozes: int = 0


def now() -> float:
    return asyncio.get_running_loop().time()


class FakeStore:
    def __init__(self, queues: Sequence[str], worker_id: str = "w") -> None:
        self.queues = list(queues)
        self.worker_id = worker_id
        self.rows: dict[uuid.UUID, FakeRow] = {}
        self.published: list[Spell] = []
        self.calls: list[tuple[str, Any]] = []  # (statement, what it was given)
        self.lost: list[tuple[uuid.UUID, str | None]] = []  # record_lost: (job, why)
        self.parked: list[Spell] = []  # unpark_freed hands these out, one a call
        self._raise: dict[str, list[BaseException]] = {}
        self._lose_reply: set[str] = set()

    # ── test controls ──

    def add(self, queue: str = "q", payload: str = "{}", **kw: Any) -> uuid.UUID:
        row = FakeRow(uuid.uuid4(), queue, payload, **kw)
        self.rows[row.id] = row
        return row.id

    def fail_next(self, name: str, *excs: BaseException) -> None:
        self._raise.setdefault(name, []).extend(excs)

    def lose_reply(self, name: str) -> None:
        self._lose_reply.add(name)

    def lapse(self, job_id: uuid.UUID) -> None:
        """The database's deadline passes (as a cancel or a long freeze would)."""
        self.rows[job_id].expires = now() - 0.001

    def named(self, name: str) -> list[Any]:
        return [given for n, given in self.calls if n == name]

    def _enter(self, name: str, given: Any) -> None:
        self.calls.append((name, given))
        if self._raise.get(name):
            raise self._raise[name].pop(0)

    def _leave(self, name: str) -> None:
        if name in self._lose_reply:
            self._lose_reply.discard(name)
            raise DatabaseUnavailable(f"database unavailable: {name}'s reply lost")

    def _held(self, job_id: uuid.UUID, lock: uuid.UUID) -> FakeRow | None:
        row = self.rows.get(job_id)
        if row is None or row.lock != lock or row.status != "active" or row.expires <= now():
            return None
        return row

    # ── WorkerStore ──

    async def claim(self, ids: Sequence[uuid.UUID], locks: Sequence[uuid.UUID],
                    retried: bool) -> Claimed:
        self._enter("claim", list(ids))
        if any(self.rows[i].poison for i in ids if i in self.rows):
            import asyncpg
            raise asyncpg.exceptions.NumericValueOutOfRangeError("value out of range")
        out: list[Claim | None] = []
        seen: set[uuid.UUID] = set()
        for job_id, lock in zip(ids, locks):
            row = self.rows.get(job_id)
            mine = retried and row is not None and self._held(job_id, lock) is not None
            if row is None or job_id in seen or not (mine or (
                    row.status == "queued" and row.queue in self.queues and row.run_at <= now())):
                out.append(None)
                continue
            seen.add(job_id)
            if not mine:
                row.status, row.lock, row.worker = "active", lock, self.worker_id
                row.expires, row.attempts = now() + row.lease_s, row.attempts + 1
            out.append(self._claim_row(row))
        self._leave("claim")
        return Claimed(out, [])

    def _claim_row(self, row: FakeRow) -> Claim:
        assert row.lock is not None
        return Claim(row.id, row.queue, row.lock, row.payload, row.attempts, row.stalls,
                     datetime.now(UTC), row.suspect, row.handoffs, row.lease_s, row.timeout_s,
                     row.grace_s, 65536, row.limited, row.id)

    async def claim_misses(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Miss]:
        self._enter("claim_misses", list(ids))
        return {i: Miss(i, r.queue, r.status, r.run_at > now(), False, False)
                for i in ids if (r := self.rows.get(i)) is not None}

    async def quarantine(self, job_id: uuid.UUID, lock: uuid.UUID) -> bool:
        self._enter("quarantine", job_id)
        row = self.rows[job_id]
        if not row.poison:
            return False
        row.status, row.error = "failed", "cannot be claimed: value out of range"
        return True

    async def renew(self, leases: Sequence[Lease], within_s: float) -> Renewal:
        self._enter("renew", [le.job_id for le in leases])
        held, busy, cancelled = set(), set(), set()
        for le in leases:
            row = self._held(le.job_id, le.lock)
            if row is not None and row.locked:
                busy.add(le.job_id)
            elif row is not None:
                row.expires = now() + row.lease_s
                held.add(le.job_id)
            elif (mine := self.rows.get(le.job_id)) is not None and mine.lock == le.lock \
                    and mine.status == "cancelled":  # finished_by: cancelled under its run
                cancelled.add(le.job_id)
        self._leave("renew")
        return Renewal(frozenset(held), frozenset(busy), frozenset(cancelled))

    async def complete(self, leases: Sequence[Lease],
                       results: Sequence[str | None]) -> list[bool]:
        self._enter("complete", [le.job_id for le in leases])
        out = []
        for le, result in zip(leases, results):
            row = self._held(le.job_id, le.lock)
            if row is not None:
                row.status, row.result = "completed", result
            again = self.rows[le.job_id]
            out.append(row is not None or (again.lock == le.lock and again.status == "completed"))
        self._leave("complete")
        return out

    async def fail(self, failures: Sequence[Failure]) -> list[Failed | None]:
        self._enter("fail", [(f.lease.job_id, f.error, f.retry, f.delay_s) for f in failures])
        out: list[Failed | None] = []
        for f in failures:
            row = self._held(f.lease.job_id, f.lease.lock)
            if row is None:
                again = self.rows[f.lease.job_id]
                ours = again.lock == f.lease.lock and again.status in ("queued", "failed")
                out.append(Failed(again.id, again.status, None) if ours else None)
                continue
            row.error = f.error
            if f.retry and row.attempts < row.max_attempts:
                delay = f.delay_s if f.delay_s is not None else 0.01
                row.status, row.run_at = "queued", now() + delay
                out.append(Failed(row.id, "queued", delay))
            else:
                row.status = "failed"
                out.append(Failed(row.id, "failed", None))
        self._leave("fail")
        return out

    async def snooze(self, lease_: Lease, seconds: float, hold: bool,
                     why: str) -> Failed | None:
        """queries.sql's snooze, without the key hold (no claim here reads one)."""
        self._enter("snooze", (lease_.job_id, seconds, hold, why))
        row = self._held(lease_.job_id, lease_.lock)
        if row is None:
            return None
        if row.snoozes >= MAX_SNOOZES:
            row.status, row.error = "failed", f"snoozed {MAX_SNOOZES} times"
            return Failed(row.id, "failed", None)
        row.status, row.run_at, row.snoozes = "queued", now() + seconds, row.snoozes + 1
        row.attempts -= 1
        return Failed(row.id, "queued", seconds)

    async def suspend(self, lease_: Lease, until: float | None, wake_on: str | None,
                      why: str, joining: list[uuid.UUID] | None = None) -> bool:
        """queries.sql's suspend, without the mailbox (nothing here signals)."""
        self._enter("suspend", (lease_.job_id, until, wake_on, why))
        row = self._held(lease_.job_id, lease_.lock)
        if row is None:
            return False
        row.status, row.attempts = "queued", row.attempts - 1
        return True

    async def release(self, leases: Sequence[Lease], why: str,
                      handoff: bool) -> list[Spell]:
        self._enter("release", ([le.job_id for le in leases], why, handoff))
        out = []
        for le in leases:
            row = self._held(le.job_id, le.lock)
            if row is not None:
                row.status, row.lock = "queued", uuid.uuid4()
                row.handoffs += handoff
                out.append(Spell(row.id, row.queue, row.lock))
        return out

    async def child_died(self, lease_: Lease, why: str) -> ChildDeath | None:
        self._enter("child_died", (lease_.job_id, why))
        row = self._held(lease_.job_id, lease_.lock)
        if row is None:
            return None
        row.stalls += 1
        row.status = "failed" if row.stalls > row.max_stalls else "queued"
        return ChildDeath(row.id, row.queue, lease_.lock, row.status, row.stalls,
                          row.status == "queued")

    async def isolate(self, lease_: Lease) -> bool:
        self._enter("isolate", lease_.job_id)
        row = self._held(lease_.job_id, lease_.lock)
        if row is not None:
            row.isolated = True
        return row is not None

    async def unpark_freed(self, finished: Lease) -> list[Spell]:
        self._enter("unpark_freed", finished.job_id)
        return [self.parked.pop(0)] if self.parked else []

    async def progress(self, lease_: Lease, text: str) -> bool:
        self._enter("progress", (lease_.job_id, text))
        row = self._held(lease_.job_id, lease_.lock)
        if row is not None:
            row.progress = text
        return row is not None

    async def record_lost(self, lease_: Lease) -> None:
        self.lost.append((lease_.job_id, lease_.lost))

    async def trace_of(self, job_id: uuid.UUID) -> str | None:
        return None

    async def publish(self, spells: Sequence[Spell]) -> None:
        self.published.extend(spells)

    def link(self, job_id: uuid.UUID, lock: uuid.UUID,
             max_result_bytes: int) -> JobLink | None:
        return None
