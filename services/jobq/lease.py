"""The lease: the statements by which a worker, and an operator, move a
job's lease columns (status, lock, lease_expires_at, stalls, isolated); the
SQL is in ``queries.sql``. Workers' writes are fenced by their token;
operators' (cancel, retry) are guarded by the status they move from. The
only other writers of these columns are the reapers' (``reaper/store.py``:
requeue a lapsed lease, cut an overdue one, unpark), each under FOR UPDATE
SKIP LOCKED and re-checked under the lock. ``published_at`` is set only by
the publish marks (``client/store.py``); a transition that puts a row back
in line clears it in the same statement.

A consumer holds a :class:`Lease` per job it runs. Besides the database's
deadline, each lease keeps a local *trusted until* on the event loop's
monotonic clock: the start of the last successful claim/renewal plus
``lease_s * (1 - margin)``. Past it the worker stops the handler on its own
(self-fencing), before the database could let the lease lapse, so a worker
cut off from the database never runs a job that the reaper hands to someone
else. The database clock alone decides whether a lease is valid; the local
clock only makes the worker give up earlier.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from jobq.db import Database, execute, fetch, fetchval, translated
from jobq.rows import ChildDeath, Claim, Claimed, Failed, Lapsed, Miss, Renewal, Spell, Vanished, of
from jobq.runtime.retries import RetryPolicy
from jobq.sql import Q
from jobq.status import Status


@dataclass(eq=False)
class Lease:
    job_id: uuid.UUID
    queue: str
    lock: uuid.UUID
    lease_s: float
    margin_fraction: float
    trusted_until: float  # event-loop time
    renewed_at: float = 0.0  # event-loop time the last successful claim/renewal was sent
    grace_s: float = 2.0  # the queue's vanished_grace_s: how short the reaper may cut it
    lost: str | None = None  # why the lease was lost, once it is
    finishing: bool = False  # final write (complete/fail/release) under way

    @classmethod
    def from_claim(cls, row: Claim, sent_at: float, margin_fraction: float) -> Lease:
        lease_s = float(row.lease_s)
        return cls(row.id, row.queue, row.lock, lease_s, margin_fraction,
                   sent_at + lease_s * (1 - margin_fraction), sent_at,
                   float(row.vanished_grace_s))

    def session_lost(self, at: float) -> None:
        """Our registry session ended at ``at``: a reaper may now cut the lease
        to ``grace_s``, so trust it no longer than that (minus the margin)."""
        self.trusted_until = min(self.trusted_until,
                                 at + self.grace_s * (1 - self.margin_fraction))

    def extend(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` succeeded."""
        if self.lost is None:
            self.renewed_at = max(self.renewed_at, sent_at)
            self.trusted_until = max(self.trusted_until,
                                     sent_at + self.lease_s * (1 - self.margin_fraction))


# ── worker side: every write fenced by (id, lock, status='active', not lapsed) ──

def in_lock_order(leases: Iterable[Lease]) -> list[Lease]:
    """Leases sorted by job id (uuid order, as PostgreSQL sorts uuids). The
    batched writes of one worker (renew on its registry session, complete,
    fail, release on the pool) run at once and can name the same rows; each
    locks its rows in the order of its arrays (a nested loop over unnest,
    the primary key inside), so one order for all of them, the claim's ORDER
    BY id, means they queue behind each other instead of deadlocking (seen:
    q_renew against q_complete, issue #36)."""
    return sorted(leases, key=lambda le: le.job_id.bytes)


async def complete_in(conn: Database, job_id: uuid.UUID, lock: uuid.UUID) -> bool:
    """Complete inside the caller's open transaction (``job.complete_in``)."""
    return bool(await fetch(conn, Q["complete"], [job_id], [lock], [None]))


async def claim(pool: asyncpg.Pool, ids: Sequence[uuid.UUID], worker_id: str,
                queues: Sequence[str], locks: Sequence[uuid.UUID] | None = None,
                retried: bool = False) -> list[Claim | None]:
    """:func:`claim_batch`'s rows alone (tests and one-off tools)."""
    return (await claim_batch(pool, ids, worker_id, queues, locks, retried)).rows


async def claim_batch(pool: asyncpg.Pool, ids: Sequence[uuid.UUID], worker_id: str,
                      queues: Sequence[str], locks: Sequence[uuid.UUID] | None = None,
                      retried: bool = False) -> Claimed:
    """Claim the given ids with these lock tokens (fresh ones if None).
    ``retried``: an earlier attempt with the same tokens may have committed
    unseen; its rows count as ours."""
    locks = list(locks) if locks is not None else [uuid.uuid4() for _ in ids]
    rows = await fetch(pool, Q["claim"], list(ids), worker_id, list(queues), locks)
    by_via: dict[uuid.UUID, Claim] = {}
    handed: list[Spell] = []
    for r in rows:
        if r["handed"]:
            handed.append(Spell(r["id"], r["queue"], r["lock"]))
        else:
            by_via[r["via"]] = of(Claim, r)
    if retried and len(by_via) < len(set(ids)):
        missed = [(i, lk) for i, lk in zip(ids, locks) if i not in by_via]
        for r in await fetch(pool, Q["claim_recover"], [i for i, _ in missed],
                             [lk for _, lk in missed], worker_id):
            by_via[r["via"]] = of(Claim, r)
    # The same id twice in one batch (a duplicate delivery) is claimed once:
    # only its first occurrence gets the row.
    return Claimed([by_via.pop(i, None) for i in ids], handed)


async def claim_misses(pool: asyncpg.Pool, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Miss]:
    rows = await fetch(pool, Q["claim_misses"], list(ids))
    return {r["id"]: of(Miss, r) for r in rows}


async def renew(conn: Database, leases: Sequence[Lease], worker_id: str) -> Renewal:
    """One statement for all leases, on the registry session (not pooled);
    it never waits for a row lock (queries.sql: renew). A lease left out is
    lost; one read says which were cancelled under us (no fault, not told as
    one). It never fails the renewal, committed by then: unread, lost."""
    if not leases:
        return Renewal(frozenset())
    with translated():
        leases = in_lock_order(leases)
        rows = await fetch(conn, Q["renew"], [le.job_id for le in leases],
                           [le.lock for le in leases], [le.lease_s for le in leases], worker_id)
    gone, again = [le for le in leases if le.job_id not in {r["id"] for r in rows}], []
    with contextlib.suppress(Exception):
        again = await fetch(conn, Q["finished_by"], [le.job_id for le in gone],
                            [le.lock for le in gone]) if gone else []
    return Renewal(frozenset(r["id"] for r in rows if r["renewed"]),
                   frozenset(r["id"] for r in rows if not r["renewed"]),
                   frozenset(r["id"] for r in again if r["status"] == Status.CANCELLED))


async def complete(pool: asyncpg.Pool, leases: Sequence[Lease],
                   results: Sequence[str | None] | None = None) -> list[bool]:
    """Complete each lease's job, storing its result (JSON text or None);
    True also when this token had already done it."""
    pairs = sorted(zip(leases, results if results is not None else [None] * len(leases)),
                   key=lambda p: p[0].job_id.bytes)  # in_lock_order, with each one's result
    rows = await fetch(pool, Q["complete"], [le.job_id for le, _ in pairs],
                       [le.lock for le, _ in pairs], [r for _, r in pairs])
    done = {r["id"] for r in rows}
    missed = [le for le in leases if le.job_id not in done]
    if missed:
        # A retried completion whose first reply was lost: already ours.
        again = await fetch(pool, Q["finished_by"], [le.job_id for le in missed],
                            [le.lock for le in missed])
        done |= {r["id"] for r in again if r["status"] == Status.COMPLETED}
    return [le.job_id in done for le in leases]


@dataclass(frozen=True)
class Failure:
    lease: Lease
    error: str
    retry: bool
    delay_s: float | None = None
    policy: RetryPolicy | None = None  # the handler's attempts and backoff, over the queue's
    traceback: str | None = None  # where it failed (worker/tracebacks.py)


async def fail(pool: asyncpg.Pool, failures: Sequence[Failure]) -> list[Failed | None]:
    """Record handler failures; per item the row (status, retry_in_s) or None
    if lost. A retried write whose first reply was lost finds its own token
    on a row it already moved (queued for a retry, or failed): that is ours,
    with retry_in_s None."""
    ordered = sorted(failures, key=lambda f: f.lease.job_id.bytes)  # see in_lock_order
    rows = await fetch(
        pool, Q["fail"],
        [f.lease.job_id for f in ordered], [f.lease.lock for f in ordered],
        [f.error[:4000] for f in ordered], [f.retry for f in ordered],
        [f.delay_s for f in ordered], [f.traceback for f in ordered],
        *([getattr(f.policy, k, None) for f in ordered]
          for k in ("max_attempts", "backoff_base_s", "backoff_max_s")))
    by_id: dict[uuid.UUID, Failed] = {r["id"]: of(Failed, r) for r in rows}
    missed = [f.lease for f in failures if f.lease.job_id not in by_id]
    if missed:
        again = await fetch(pool, Q["finished_by"], [le.job_id for le in missed],
                            [le.lock for le in missed])
        for r in again:
            if r["status"] in (Status.QUEUED, Status.FAILED):
                by_id[r["id"]] = Failed(r["id"], r["status"], None)
    return [by_id.get(f.lease.job_id) for f in failures]


async def release(pool: asyncpg.Pool, leases: Iterable[Lease],
                  why: str = "worker shutting down", handoff: bool = False) -> list[Spell]:
    """Give leases back at once: rows (id, queue, lock) that were released."""
    leases = list(leases)
    if not leases:
        return []
    leases = in_lock_order(leases)
    return [of(Spell, r) for r in await fetch(pool, Q["release"], [le.job_id for le in leases],
                                              [le.lock for le in leases], why, handoff)]


async def progress(pool: asyncpg.Pool, lease_: Lease, value: str) -> bool:
    """Store a running job's progress (JSON text); False if the lease is lost."""
    return bool(await fetch(pool, Q["progress"], lease_.job_id, lease_.lock, value))


async def parents(pool: Database, job_id: uuid.UUID, lock: uuid.UUID) -> list[Any]:
    """The jobs this one waited for, with their results (id, status, result
    as JSON text); only for the holder of its live lease."""
    return list(await fetch(pool, Q["parents"], job_id, lock))


async def step_get(pool: Database, job_id: uuid.UUID, lock: uuid.UUID,
                   name: str) -> tuple[str, str | None] | None:
    """(function, result as JSON text) of a step this job recorded, if it did."""
    rows = await fetch(pool, Q["step_get"], job_id, lock, name)
    return (rows[0]["fn"], rows[0]["result"]) if rows else None


async def step_record(pool: Database, job_id: uuid.UUID, lock: uuid.UUID, name: str,
                      fn: str, result: str | None) -> bool:
    """Record a step's result, fenced by the live lease; False: not recorded
    (the lease is gone, or this run recorded it already)."""
    return bool(await fetchval(pool, Q["step_record"], job_id, lock, name, fn, result))


async def unpark_freed(pool: asyncpg.Pool, finished: Lease) -> list[Spell]:
    """A finished run frees a slot of its limited queue: release the best
    job parked there (a spell whose token the database made; the finished
    run's proof is spent)."""
    return [of(Spell, r) for r in await fetch(pool, Q["unpark_freed"], finished.job_id,
                                              finished.lock, None)]


async def isolate(pool: asyncpg.Pool, lease_: Lease) -> bool:
    """Mark a suspect's run as the one its worker isolates; False if lost."""
    return bool(await fetch(pool, Q["isolate"], lease_.job_id, lease_.lock))


async def child_died(pool: asyncpg.Pool, lease_: Lease, why: str) -> ChildDeath | None:
    """The child process running this job died: charge it one stall and
    requeue it now (or fail it as a job of death). The row, or None if lost."""
    rows = await fetch(pool, Q["child_died"], lease_.job_id, lease_.lock, why[:4000])
    return of(ChildDeath, rows[0]) if rows else None


async def quarantine(pool: asyncpg.Pool, job_id: uuid.UUID, worker_id: str,
                     queues: Sequence[str], lock: uuid.UUID) -> bool:
    """Fail a queued job whose own data makes its claim fail. The database
    tries the claim itself and fails the job only on a data error, with its
    own message; False: the claim works (rolled back), nothing changed."""
    return bool(await fetchval(pool, Q["quarantine"], job_id, worker_id, list(queues), lock))


# ── operators (admin.py): status-guarded, not fenced by a token ──

async def cancel(pool: Database, job_id: uuid.UUID, reason: str | None) -> bool:
    """queued/active -> cancelled; an active job's worker learns it at its
    next renewal (its fenced writes need status = 'active') and stops."""
    return bool(await fetch(pool, Q["cancel"], job_id, reason))


async def retry_failed(pool: asyncpg.Pool, job_id: uuid.UUID,
                       who: str | None = None) -> Spell | str | None:
    """failed/cancelled -> queued; its spell (lock None: it waits for others
    again, nothing to publish), why it was refused (a job it waits for
    failed), or None (it was not failed or cancelled)."""
    rows = await fetch(pool, Q["retry_failed"], job_id, who)
    if not rows:
        return None
    if rows[0]["refused"] is not None:
        return str(rows[0]["refused"])
    return of(Spell, rows[0])


# ── reaper side ──

async def requeue_lapsed(pool: asyncpg.Pool, limit: int, reaper_id: str) -> list[Lapsed]:
    """Requeue (or fail, past max_stalls) active jobs whose lease lapsed."""
    return [of(Lapsed, r) for r in await fetch(pool, Q["requeue_lapsed"], limit, reaper_id)]


async def cut_vanished(pool: asyncpg.Pool) -> list[Vanished]:
    """Workers whose registry session ended: cut their leases to the grace."""
    return [of(Vanished, r) for r in await fetch(pool, Q["workers_vanished"])]


async def record_lost(pool: asyncpg.Pool, lease_: Lease) -> None:
    """History only: the worker learned it lost this lease. Best effort:
    the database may be why the lease was lost."""
    with contextlib.suppress(Exception):
        await execute(pool, Q["lease_lost_event"], lease_.job_id, lease_.lock, lease_.lost)
