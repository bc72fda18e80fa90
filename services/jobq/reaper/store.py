"""What the reapers need from outside themselves, as one Protocol, and the
real one (as ``worker/store.py`` is the worker's; River's riverdriver).

The duties (``duties.py``) reach the database and the broker only through
:class:`ReaperStore`, with typed rows back; :class:`PgReaperStore` runs the
statements of queries.sql on the reaper's pool and publishes on its broker;
``harness/fake_reaper_store.py`` stands in for it in
``tests/unit/test_reaper_duties.py``.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime
from typing import Protocol

import asyncpg

from jobq import lease
from jobq.amqp.broker import Broker
from jobq.db import Database, execute, fetch, fetchrow, fetchval, transaction, translated
from jobq.rows import Backlog, DueSlot, Lapsed, Overdue, Probe, Settled, Superseded, Vanished, of
from jobq.runtime import crash
from jobq.sql import Q

log = logging.getLogger("jobq.reaper")

RETRY_LATER_S = 5.0  # a row the broker would not take is tried again after this


class ReaperStore(Protocol):
    async def probe(self) -> Probe:
        """Which duties have anything to do, and when the next deadline comes."""

    async def cut_vanished(self) -> list[Vanished]: ...

    async def requeue_lapsed(self, limit: int, reaper_id: str) -> list[Lapsed]: ...

    async def schedules_due(self, limit: int) -> list[DueSlot]: ...

    async def fire(self, slot: DueSlot, next_slot: datetime) -> tuple[uuid.UUID | None, bool]:
        """Enqueue the slot's job (its id), or skip the slot (overlap skip:
        True); (None, False) when another reaper fires or fired it."""

    async def skip(self, slot: DueSlot, next_slot: datetime | None, why: str) -> None: ...

    async def unpark(self) -> int: ...

    async def wake_signalled(self, limit: int) -> int:
        """Make jobs waiting for a signal that came due now; how many."""

    async def expire_due(self, limit: int) -> int:
        """Cancel unstarted jobs past their deadline (expired); how many."""

    async def supersede_pending(self, limit: int) -> Superseded:
        """Cancel latest keys' older queued jobs (schema 0042, 0045)."""

    async def settle(self, budget: int, rounds: int) -> Settled: ...

    async def relay(self, batch: int, budget_s: float | None) -> int:
        """Publish due rows nobody is known to have published; how many."""

    async def republish_lost(self, queue: str, after_s: float) -> int | None:
        """Hand a queue's rows whose messages the broker lost back to the
        relay; how many (None: the broker could not say)."""

    async def lost_candidates(self, after_s: float) -> list[str]: ...

    async def prune_finished(self, batch: int) -> int: ...

    async def prune_keys(self) -> None: ...

    async def prune_workers(self) -> None: ...

    async def backlog(self, timeout_s: float) -> list[Backlog]:
        """Queued jobs per queue and state; gives up after ``timeout_s``."""

    async def record_sweep(self, reaper_id: str, sweeps: int, failing: str | None) -> Overdue:
        """Monitor the monitor: this reaper's last sweep (jobq.reaper_status)."""

    async def register(self, reaper_id: str, host: str, pid: int) -> None: ...

    async def failed(self, reaper_id: str, why: str) -> None: ...

    async def gone(self, reaper_id: str) -> None: ...


class PgReaperStore:
    def __init__(self, pool: asyncpg.Pool, broker: Broker) -> None:
        self.pool = pool
        self.broker = broker

    async def probe(self) -> Probe:
        with translated():
            row = await fetchrow(self.pool, Q["sweep_probe"])
        assert row is not None
        return of(Probe, row)

    async def cut_vanished(self) -> list[Vanished]:
        return await lease.cut_vanished(self.pool)

    async def requeue_lapsed(self, limit: int, reaper_id: str) -> list[Lapsed]:
        return await lease.requeue_lapsed(self.pool, limit, reaper_id)

    async def schedules_due(self, limit: int) -> list[DueSlot]:
        return [of(DueSlot, r) for r in await fetch(self.pool, Q["schedules_due"], limit)]

    async def fire(self, slot: DueSlot, next_slot: datetime) -> tuple[uuid.UUID | None, bool]:
        # The lock, then the fire, in one short transaction. A schedule
        # another reaper holds is its to fire: skipped, never waited for (a
        # reaper frozen inside the transaction holds it until
        # idle_in_transaction_session_timeout ends its session, and no other
        # reaper's sweep waits meanwhile; the slot is fired after that).
        async with transaction(self.pool) as conn:
            if not await fetch(conn, Q["schedule_try_lock"], slot.name):
                return None, False
            row = await fetchrow(conn, Q["schedule_fire"], slot.name, slot.next_run_at,
                                 next_slot)
        assert row is not None
        return row["id"], bool(row["skipped"])

    async def skip(self, slot: DueSlot, next_slot: datetime | None, why: str) -> None:
        await execute(self.pool, Q["schedule_skip"], slot.name, slot.next_run_at, next_slot,
                      why)

    async def unpark(self) -> int:
        return int((await execute(self.pool, Q["unpark"])).split()[-1])

    async def wake_signalled(self, limit: int) -> int:
        return int(await fetchval(self.pool, Q["wake_signalled"], limit))

    async def expire_due(self, limit: int) -> int:
        with translated():
            return int(await fetchval(self.pool, Q["expire_due"], limit))

    async def supersede_pending(self, limit: int) -> Superseded:
        with translated():
            row = await fetchrow(self.pool, Q["supersede_pending"], limit)
        assert row is not None
        return Superseded(int(row["cancelled"]), bool(row["more"]))

    async def settle(self, budget: int, rounds: int) -> Settled:
        with translated():
            row = await fetchrow(self.pool, Q["settle_dependants"], budget, rounds)
        assert row is not None
        return of(Settled, row)

    async def relay(self, batch: int, budget_s: float | None) -> int:
        """Rows taken FOR UPDATE SKIP LOCKED in a transaction that stays open
        until the broker confirmed: two reapers never publish one row at once,
        and a consumer that gets the id early waits for the row lock instead of
        missing the row. Dying in between costs a duplicate message. With
        ``budget_s``, no new batch starts after that long: a backlog of broker
        work must not keep a reaper from its requeues (the probe still says
        relay_due, and the loop comes straight back)."""
        total = 0
        stop_at = None if budget_s is None else time.monotonic() + budget_s
        while stop_at is None or time.monotonic() < stop_at:
            async with transaction(self.pool) as conn:
                rows = await fetch(conn, Q["relay_take"], batch)
                if not rows:
                    return total
                # Raises if nothing could be sent at all (the broker is away):
                # the transaction rolls back and the next sweep tries again.
                confirmed = await self.broker.publish([(r["id"], r["queue"]) for r in rows])
                crash.point("reaper.mid_relay")
                await execute(conn, Q["relay_mark"], list(confirmed))
                missed = [r["id"] for r in rows if r["id"] not in confirmed]
                if missed:
                    await execute(conn, Q["relay_defer"], missed, RETRY_LATER_S)
            total += len(confirmed)
            if len(rows) < batch or missed:
                return total
        return total

    async def lost_candidates(self, after_s: float) -> list[str]:
        with translated():
            return [r["queue"] for r in await fetch(self.pool, Q["lost_candidates"], after_s)]

    async def republish_lost(self, queue: str, after_s: float) -> int | None:
        try:
            empty = await self.broker.ready_count(queue) == 0
        except Exception as exc:  # broker away: try again next time
            log.debug("ready count of %s: %r", queue, exc)
            return None
        with translated():
            before = await fetchval(self.pool, Q["lost_horizon"], queue, after_s, empty)
            if before is None:
                return 0  # a backlog nobody has started on lately: nothing to tell
            return int(await fetchval(self.pool, Q["unpublish_lost"], queue, before, empty))

    async def prune_finished(self, batch: int) -> int:
        return int((await execute(self.pool, Q["prune_expired"], batch)).split()[-1])

    async def prune_keys(self) -> None:
        await execute(self.pool, Q["key_rate_prune"])

    async def prune_workers(self) -> None:
        with translated():
            await execute(self.pool, Q["workers_prune"])

    async def backlog(self, timeout_s: float) -> list[Backlog]:
        # A local setting: the timeout ends with the transaction, the pooled
        # connection keeps its own.
        with translated():
            async with transaction(self.pool) as conn:
                await execute(conn, Q["local_statement_timeout"], str(int(timeout_s * 1000)))
                return [of(Backlog, r) for r in await fetch(conn, Q["backlog"])]

    async def record_sweep(self, reaper_id: str, sweeps: int, failing: str | None) -> Overdue:
        with translated():
            row = await fetchrow(self.pool, Q["reaper_swept"], reaper_id, sweeps, failing)
        assert row is not None
        return of(Overdue, row)

    async def register(self, reaper_id: str, host: str, pid: int) -> None:
        with translated():
            await execute(self.pool, Q["reaper_register"], reaper_id, host, pid)

    async def failed(self, reaper_id: str, why: str) -> None:
        await execute(self.pool, Q["reaper_failed"], reaper_id, why)

    async def gone(self, reaper_id: str) -> None:
        await execute(self.pool, Q["reaper_gone"], reaper_id)


class PgAuditStore:
    """The invariant monitor's statements (reaper/audit.py), on a pool or a
    connection: a reaper's, or jobq audit's as the schema owner."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def claims(self, after_n: int, limit: int) -> tuple[int, int]:
        """(last event read, new two_live_leases) after event ``after_n``."""
        row = await fetchrow(self.db, Q["audit_claims"], after_n, limit)
        assert row is not None
        return int(row["last_n"]), int(row["found"])

    async def completions(self, after: tuple[datetime, uuid.UUID], limit: int
                          ) -> tuple[tuple[datetime, uuid.UUID], int]:
        """(where it read to, new completed_without_lease) after ``after``."""
        row = await fetchrow(self.db, Q["audit_completions"], *after, limit)
        assert row is not None
        return (row["last_at"], row["last_id"]), int(row["found"])

    async def now(self, grace_s: float) -> dict[str, int]:
        """New overdue_lease and unpublished violations, as the rows are now."""
        row = await fetchrow(self.db, Q["audit_now"], grace_s)
        assert row is not None
        return {"overdue_lease": int(row["overdue_lease"]),
                "unpublished": int(row["unpublished"])}

