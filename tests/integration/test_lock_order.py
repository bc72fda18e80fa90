"""Multi-row writes lock job rows in one global order, the job id's (issue
#36): a reaper's cut of a vanished worker's leases against that worker's own
batched completion, which locks in id order (lease.in_lock_order).

Found by bench/nemesis.py (seed 201, 10 minutes): PostgreSQL logged
``deadlock detected`` between ``q_complete`` and ``workers_vanished``. A
worker whose registry session was terminated is alive and completes its jobs
while a reaper cuts them; the cut locked them in scan order."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from harness.helpers import with_pool
from jobq import lease
from jobq.sql import BODY, Q, statements

LOW = uuid.UUID("00000000-0000-4000-8000-000000000001")
HIGH = uuid.UUID("ffffffff-ffff-4fff-bfff-fffffffffffe")


async def _vanished_worker_with_two_jobs(pool: asyncpg.Pool) -> None:
    await pool.execute(Q["queue_ensure"], "q")
    await pool.execute("INSERT INTO jobq.worker (worker_id, host, pid, lock_key) "
                       "VALUES ('w-cut', 'h', 1, 777)")  # nobody holds lock 777: gone
    # HIGH first: in the table's (and the active index's) order it comes
    # before LOW, the opposite of the id order the worker locks in.
    for job_id in (HIGH, LOW):
        await pool.execute(
            "INSERT INTO jobq.job (id, queue, payload, status, worker_id, lock, attempts, "
            "lease_expires_at, started_at) VALUES ($1, 'q', '{}', 'active', 'w-cut', "
            "gen_random_uuid(), 1, now() + interval '1 hour', now())", job_id)


async def _waits_for_a_row_lock(pool: asyncpg.Pool, pid: int, who: str) -> None:
    """Until backend ``pid`` waits for a row lock (LOW, held by the test)."""
    for _ in range(500):
        if await pool.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity "
                               "WHERE pid = $1", pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{who} never waited for LOW")


def test_a_cut_waits_for_a_completion_in_id_order_instead_of_deadlocking(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        await _vanished_worker_with_two_jobs(pool)
        worker = await asyncpg.connect(db_url)  # the live worker's completion, in two steps
        try:
            tx = worker.transaction()
            await tx.start()
            await worker.execute("SELECT 1 FROM jobq.job WHERE id = $1 FOR UPDATE", LOW)
            cut = asyncio.create_task(lease.cut_vanished(pool))
            await asyncio.sleep(0.3)  # the cut is now waiting for a row lock
            # The completion's second row. A cut that took HIGH before it
            # waited for LOW now closes a cycle: PostgreSQL fails one of the
            # two after deadlock_timeout.
            await worker.execute("UPDATE jobq.job SET status = 'completed', finished_at = now(), "
                                 "lease_expires_at = NULL WHERE id = ANY($1::uuid[])",
                                 [LOW, HIGH])
            await tx.commit()
            (gone,) = await asyncio.wait_for(cut, 10)
            assert gone.worker_id == "w-cut" and gone.jobs == 0, gone  # both finished first
        finally:
            await worker.close()

    with_pool(db_url, body)


def test_a_completion_locks_in_id_order_whatever_its_plan_scans(db_url: str) -> None:
    """The two ``deadlock detected`` of bench/nemesis.py seed 5201: on a table
    the planner thought tiny, the completion's update scanned it in physical
    order (HIGH before LOW here) and took HIGH first, against the cut's id
    order. With index scans off the plan is that one; the completion must
    still wait on LOW before it touches HIGH."""
    async def body(pool: asyncpg.Pool) -> None:
        await _vanished_worker_with_two_jobs(pool)
        tokens = {r["id"]: r["lock"] for r in await pool.fetch("SELECT id, lock FROM jobq.job")}
        holder = await asyncpg.connect(db_url)
        worker = await asyncpg.connect(db_url)
        try:
            await worker.execute("SET enable_indexscan = off; SET enable_bitmapscan = off")
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM jobq.job WHERE id = $1 FOR UPDATE", LOW)
            pid = await worker.fetchval("SELECT pg_backend_pid()")
            done = asyncio.create_task(worker.fetch(
                statements(BODY["complete"])[-1], [LOW, HIGH], [tokens[LOW], tokens[HIGH]],
                [None, None]))
            await _waits_for_a_row_lock(pool, pid, "the completion")
            # It waits for LOW and holds nothing after it: HIGH is free.
            async with pool.acquire() as other, other.transaction():
                assert await other.fetchval(
                    "SELECT 1 FROM jobq.job WHERE id = $1 FOR UPDATE NOWAIT", HIGH) == 1
            await tx.commit()
            assert len(await asyncio.wait_for(done, 10)) == 2
        finally:
            await holder.close()
            await worker.close()

    with_pool(db_url, body)


def test_a_cancel_locks_a_parent_and_its_children_in_id_order(db_url: str) -> None:
    """CI's ``deadlock detected`` (test_suspension): cancelling a joining
    parent locked it, then its children in scan order, while a consumer
    claiming two of those children in one batch locked them in id order.
    Here the parent (MID) joins LOW and HIGH, the plan scans in physical
    order, and a claim holds LOW: the cancel must wait on LOW holding
    neither MID nor HIGH."""
    mid = uuid.UUID("80000000-0000-4000-8000-000000000000")

    async def body(pool: asyncpg.Pool) -> None:
        await pool.execute(Q["queue_ensure"], "q")
        for job_id in (HIGH, LOW):  # physical order: HIGH first
            await pool.execute("INSERT INTO jobq.job (id, queue, payload) VALUES ($1, 'q', '{}')",
                               job_id)
        await pool.execute("INSERT INTO jobq.job (id, queue, payload, joining, run_at) VALUES "
                           "($1, 'q', '{}', $2, 'infinity')", mid, [HIGH, LOW])
        holder = await asyncpg.connect(db_url)
        operator = await asyncpg.connect(db_url)
        try:
            await operator.execute("SET enable_indexscan = off; SET enable_bitmapscan = off")
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM jobq.job WHERE id = $1 FOR UPDATE", LOW)
            pid = await operator.fetchval("SELECT pg_backend_pid()")
            cancel = asyncio.create_task(lease.cancel(operator, mid, "no longer needed"))
            await _waits_for_a_row_lock(pool, pid, "the cancel")
            async with pool.acquire() as other, other.transaction():
                for free in (mid, HIGH):
                    assert await other.fetchval(
                        "SELECT 1 FROM jobq.job WHERE id = $1 FOR UPDATE NOWAIT", free) == 1
            await tx.commit()
            assert await asyncio.wait_for(cancel, 10) is True
            rows = await pool.fetch("SELECT status::text FROM jobq.job ORDER BY id")
            assert [r["status"] for r in rows] == ["cancelled"] * 3, rows
        finally:
            await holder.close()
            await operator.close()

    with_pool(db_url, body)
