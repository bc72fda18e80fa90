"""Multi-row writes lock job rows in one global order, the job id's (issue
#36): a reaper's cut of a vanished worker's leases against that worker's own
batched completion, which locks in id order (lease.in_lock_order).

Found by bench/nemesis.py (seed 201, 10 minutes): PostgreSQL logged
``deadlock detected`` between ``q_complete`` and ``workers_vanished``. A
worker whose registry session was terminated is alive and completes its jobs
while a reaper cuts them; the cut locked them in scan order. Then (issue
#52's nemesis, seed 5201) the completion itself scanned in physical order on
a table the planner thought tiny, and deadlocked with the id-ordered cut: the
cut now skips a row someone holds (SKIP LOCKED) instead of waiting."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from harness.helpers import with_pool
from jobq import lease
from jobq.sql import Q

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


def test_a_cut_skips_a_row_its_worker_is_finishing_instead_of_waiting(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        await _vanished_worker_with_two_jobs(pool)
        worker = await asyncpg.connect(db_url)  # the live worker's completion, in two steps
        try:
            tx = worker.transaction()
            await tx.start()
            await worker.execute("SELECT 1 FROM jobq.job WHERE id = $1 FOR UPDATE", LOW)
            # The cut neither waits for LOW nor closes a cycle: it skips the row
            # its worker is finishing (a completion may lock in the plan's
            # order, not id order: bench/nemesis.py seed 5201 deadlocked) and
            # cuts the other one, at once.
            (gone,) = await asyncio.wait_for(lease.cut_vanished(pool), 5)
            assert gone.worker_id == "w-cut" and gone.jobs == 1, gone
            await worker.execute("UPDATE jobq.job SET status = 'completed', finished_at = now(), "
                                 "lease_expires_at = NULL WHERE id = ANY($1::uuid[])",
                                 [LOW, HIGH])
            await tx.commit()
            assert await pool.fetchval("SELECT count(*) FROM jobq.job WHERE status = "
                                       "'completed'") == 2
        finally:
            await worker.close()

    with_pool(db_url, body)
