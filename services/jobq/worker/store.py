"""What a worker needs from outside itself, as one Protocol, and the real one.

The worker's units (intake, executor, completer, heartbeat) reach the
database and the broker only through :class:`WorkerStore`: the lease's
fenced statements with typed rows, and publishing the ids of rows it just
put back in line. :class:`PgStore` is the real thing (``lease.py``'s
statements on the pool and the registry session, ``client/publish.py``'s
publish and mark); ``harness/fake_store.py`` is a fake with the same rules (a token
fences every write, a lapsed lease is gone), so the worker's flow is unit
tested without services. The registry session's statements (register,
the session lock, deregister) and the consumer's start-up writes (its
queues, the app's schedules) are here too: this module is the worker's
whole database side.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Protocol

import asyncpg

from jobq import lease
from jobq.amqp.broker import Broker
from jobq.client.publish import publish_and_mark
from jobq.db import PooledConnection, execute, fetch, fetchrow, fetchval, now, session_broken
from jobq.errors import MAX_SNOOZES, BadInput, ConfigError, DatabaseUnavailable, UnavailableError
from jobq.lease import Failure, Lease
from jobq.rows import ChildDeath, Claimed, Failed, Miss, Renewal, Spell, of
from jobq.schedules import Schedule, refused
from jobq.sql import Q
from jobq.status import Status
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields
from jobq.worker.steps import JobLink

log = logging.getLogger("jobq.consumer")


class WorkerStore(Protocol):
    """Every write names its lease and is fenced by its token: a write that
    matches no row (False, None, or an id left out) means the lease is lost."""

    async def claim(self, ids: Sequence[uuid.UUID], locks: Sequence[uuid.UUID],
                    retried: bool) -> Claimed: ...

    async def claim_misses(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Miss]: ...

    async def quarantine(self, job_id: uuid.UUID, lock: uuid.UUID) -> bool: ...

    async def renew(self, leases: Sequence[Lease], within_s: float) -> Renewal:
        """Never waits for another transaction's row lock: such a lease comes
        back busy (still held, not extended)."""

    async def complete(self, leases: Sequence[Lease],
                       results: Sequence[str | None]) -> list[bool]: ...

    async def fail(self, failures: Sequence[Failure]) -> list[Failed | None]: ...

    async def release(self, leases: Sequence[Lease], why: str,
                      handoff: bool) -> list[Spell]: ...

    async def snooze(self, lease_: Lease, seconds: float, hold: bool,
                     why: str) -> Failed | None:
        """Back to queued in ``seconds``, the run not counted (``hold``: the
        key held fleet-wide until then); failed past MAX_SNOOZES. None: lost."""

    async def suspend(self, lease_: Lease, until: float | None, wake_on: str | None,
                      why: str, joining: list[uuid.UUID] | None = None) -> bool:
        """Back to queued holding nothing until ``until`` (epoch s), signal
        ``wake_on`` or the end of every job in ``joining``, the run not
        counted (issue #52). False: lost."""

    async def child_died(self, lease_: Lease, why: str) -> ChildDeath | None: ...

    async def isolate(self, lease_: Lease) -> bool: ...

    async def unpark_freed(self, finished: Lease) -> list[Spell]: ...

    async def progress(self, lease_: Lease, text: str) -> bool: ...

    async def record_lost(self, lease_: Lease) -> None: ...

    async def trace_of(self, job_id: uuid.UUID) -> str | None: ...

    async def publish(self, spells: Sequence[Spell]) -> None:
        """Publish ids of rows this worker put back in line (their spells'
        tokens are its own). Never raises: the relay is the fallback."""

    def link(self, job_id: uuid.UUID, lock: uuid.UUID,
             max_result_bytes: int) -> JobLink | None:
        """What the handler reaches as the job's holder (steps, parents)."""


async def warm(conn: asyncpg.Connection, worker_id: str, queues: Sequence[str]) -> None:
    """A new pooled session's first claim cost 13-18 ms (the statement
    prepared, the claim function's plans made) against 0.6 ms after: the
    first job after start-up, and one job per new session under load, paid
    it between its delivery and its start (bench/idle_cost.py). So each
    session claims an id no row has (nothing is taken: a claim's swap needs
    the delivered row) and completes one, before its first use. Never
    raises: a session that cannot do this now fails its first real
    statement, which is handled as any other failure."""
    try:
        await fetch(conn, Q["claim"], [uuid.uuid4()], worker_id, list(queues), [uuid.uuid4()])
        await fetch(conn, Q["complete"], [uuid.uuid4()], [uuid.uuid4()], [None])
    except Exception as exc:
        log.debug("warm-up of a new session: %r", exc)


class Session(Protocol):
    """The worker's registry session, as the store renews on it (registry.py)."""

    conn: asyncpg.Connection | None

    def reset(self) -> None: ...


# ── the registry session's statements (registry.py) ──

async def session_checks_clients(conn: asyncpg.Connection) -> None:
    """PostgreSQL 14 and later: a statement running for a client that went
    away ends within a second."""
    await execute(conn, Q["client_check_interval"])


async def lock_session(conn: asyncpg.Connection, key: int) -> bool:
    """Take the session-level advisory lock ``key`` (False: someone holds it)."""
    return bool(await fetchval(conn, Q["worker_lock"], key))


async def register(conn: asyncpg.Connection, worker_id: str, host: str, pid: int,
                   key: int) -> bool:
    """Register the worker from the session holding lock ``key`` (False: a
    live session registered that id)."""
    return await fetchval(conn, Q["worker_register"], worker_id, host, pid, key) is not None


async def say(conn: asyncpg.Connection, worker_id: str, kind: str, declared: str | None) -> None:
    """How the worker runs handlers, and the retry options its app declares."""
    await execute(conn, Q["worker_pool"], worker_id, kind)
    if declared is not None:
        await execute(conn, Q["worker_handlers"], worker_id, declared)


async def deregister(conn: asyncpg.Connection, worker_id: str) -> None:
    """Graceful stop: the worker released its leases; nothing to cut."""
    await execute(conn, Q["worker_gone"], worker_id)


async def declare_schedules(conn: asyncpg.Connection | PooledConnection,
                            schedules: Sequence[Schedule]) -> int:
    """Store the app's declared schedules; how many were stored. One that is
    refused (an operator's schedule of that name, a login that is not a
    producer, a payload over the limit) is logged once and skipped: it never
    stops the consumer."""
    at, stored = await now(conn), 0
    for s in schedules:
        try:
            with refused(s.name):
                async with conn.transaction():
                    row = await fetchrow(conn, Q["schedule_upsert"], *s.row(at))
                    if row is not None:  # its overlap, on the app's own row only
                        await execute(conn, Q["schedule_overlap"], s.name, s.overlap)
        except BadInput as exc:
            log.warning("%s; not stored", exc, extra=fields(event="schedule_refused"))
            continue
        if row is None:
            log.warning("schedule %s not stored: an operator set a schedule of that name "
                        "(jobq schedule delete %s hands it to the app), or this login is "
                        "not a producer (a schedule enqueues jobs: GRANT jobq_producer)",
                        s.name, s.name, extra=fields(event="schedule_refused"))
            continue
        stored += 1
    return stored


async def ensure_queue(pool: asyncpg.Pool, queue: str) -> None:
    """Create a queue this consumer handles, with default settings."""
    await execute(pool, Q["queue_ensure"], queue)


class PgStore:
    """The worker's statements on PostgreSQL; renewals on the registry's
    session, everything else on the pool."""

    def __init__(self, pool: asyncpg.Pool, broker: Broker, registry: Session,
                 worker_id: str, queues: Sequence[str]) -> None:
        self.pool = pool
        self.broker = broker
        self.registry = registry
        self.worker_id = worker_id
        self.queues = list(queues)

    async def claim(self, ids: Sequence[uuid.UUID], locks: Sequence[uuid.UUID],
                    retried: bool) -> Claimed:
        started = time.perf_counter()
        got = await lease.claim_batch(self.pool, ids, self.worker_id, self.queues, locks,
                                      retried)
        metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
        return got

    async def claim_misses(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Miss]:
        return await lease.claim_misses(self.pool, ids)

    async def quarantine(self, job_id: uuid.UUID, lock: uuid.UUID) -> bool:
        return await lease.quarantine(self.pool, job_id, self.worker_id, self.queues, lock)

    async def renew(self, leases: Sequence[Lease], within_s: float) -> Renewal:
        """Bounded: a renewal hanging on a cut network must not stall every
        later one. A failure that leaves the session unfit (abandoned
        mid-flight, terminated, a driver error: reusing it is how "another
        operation is in progress" happens) ends it, and the registry
        re-registers and renews at once; a plain SQL error (a conflict) on a
        healthy session keeps it, so reapers do not see us vanish."""
        conn = self.registry.conn
        if conn is None:
            raise DatabaseUnavailable("worker registry session is down")
        try:
            return await asyncio.wait_for(lease.renew(conn, leases, self.worker_id), within_s)
        except Exception as exc:
            if not isinstance(exc, UnavailableError | TimeoutError | ConfigError):
                log.exception("lease renewal raised unexpectedly")
            if session_broken(exc):
                self.registry.reset()
            raise

    async def complete(self, leases: Sequence[Lease],
                       results: Sequence[str | None]) -> list[bool]:
        return await lease.complete(self.pool, leases, results)

    async def fail(self, failures: Sequence[Failure]) -> list[Failed | None]:
        return await lease.fail(self.pool, failures)

    async def release(self, leases: Sequence[Lease], why: str,
                      handoff: bool) -> list[Spell]:
        return await lease.release(self.pool, leases, why, handoff)

    async def snooze(self, lease_: Lease, seconds: float, hold: bool,
                     why: str) -> Failed | None:
        rows = await fetch(self.pool, Q["snooze"], lease_.job_id, lease_.lock, seconds, hold,
                           MAX_SNOOZES, why)
        if rows:
            return of(Failed, rows[0])
        # A retried write whose first reply was lost finds its own token.
        for r in await fetch(self.pool, Q["finished_by"], [lease_.job_id], [lease_.lock]):
            if r["status"] in (Status.QUEUED, Status.FAILED):
                return Failed(r["id"], r["status"], None)
        return None

    async def suspend(self, lease_: Lease, until: float | None, wake_on: str | None,
                      why: str, joining: list[uuid.UUID] | None = None) -> bool:
        if await fetch(self.pool, Q["suspend"], lease_.job_id, lease_.lock, until, wake_on,
                       why, joining):
            return True
        # A retried write whose first reply was lost finds its own token.
        return any(r["status"] == Status.QUEUED for r in await fetch(
            self.pool, Q["finished_by"], [lease_.job_id], [lease_.lock]))

    async def child_died(self, lease_: Lease, why: str) -> ChildDeath | None:
        return await lease.child_died(self.pool, lease_, why)

    async def isolate(self, lease_: Lease) -> bool:
        return await lease.isolate(self.pool, lease_)

    async def unpark_freed(self, finished: Lease) -> list[Spell]:
        return await lease.unpark_freed(self.pool, finished)

    async def progress(self, lease_: Lease, text: str) -> bool:
        return await lease.progress(self.pool, lease_, text)

    async def record_lost(self, lease_: Lease) -> None:
        await lease.record_lost(self.pool, lease_)

    async def trace_of(self, job_id: uuid.UUID) -> str | None:
        stored: str | None = await fetchval(self.pool, Q["trace_of"], job_id)
        return stored

    async def publish(self, spells: Sequence[Spell]) -> None:
        if spells:
            await publish_and_mark(self.broker, self.pool, spells, own_spells=True)

    def link(self, job_id: uuid.UUID, lock: uuid.UUID,
             max_result_bytes: int) -> JobLink | None:
        return JobLink(self.pool, job_id, lock, max_result_bytes)

    async def wake_reapers(self) -> None:
        """NOTIFY jobq_busy: a reaper in its idle sleep probes again, so a
        crash right after this claim is noticed at the busy pace
        (reaper/wakes.py). Never raises: without it, the idle sleep still
        ends before any lease can lapse."""
        try:
            await execute(self.pool, Q["worker_busy"])
        except Exception as exc:
            log.debug("worker_busy: %r", exc)
