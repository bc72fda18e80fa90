"""The fault suite's own counters (harness/under_load.py) see what they
claim to count: a job whose row was completed twice is counted, one
completed once is not. jobq keeps no history row for a completion, so the
count comes from a trigger the harness installs, and would read 0 forever
if it observed nothing."""

from __future__ import annotations

import uuid

import asyncpg

from harness.helpers import SyncDB
from harness.helpers import with_pool as run
from harness.under_load import COMPLETIONS_DDL, count
from jobq import lease
from jobq.lease import Lease


async def claim_and_complete(pool: asyncpg.Pool, job_id: uuid.UUID) -> None:
    (row,) = await lease.claim(pool, [job_id], "w1", ["q"])
    assert row is not None
    assert await lease.complete(pool, [Lease.from_claim(row, 0.0, 0.15)]) == [True]


def test_a_job_completed_twice_is_counted(db: SyncDB, db_url: str) -> None:
    db.execute(COMPLETIONS_DDL)
    db.execute(COMPLETIONS_DDL)  # installed again by the next run: idempotent
    once, twice = (db.val("SELECT jobq.enqueue('q', '{}')") for _ in range(2))

    async def body(pool: asyncpg.Pool) -> None:
        await claim_and_complete(pool, once)
        await claim_and_complete(pool, twice)
        # What a broken fence or a bad requeue would do: the row runs again.
        await pool.execute("UPDATE jobq.job SET status = 'queued' WHERE id = $1", twice)
        await claim_and_complete(pool, twice)

    run(db_url, body)
    assert count(db, [once], None)["completed_twice"] == 0
    assert count(db, [once, twice], None)["completed_twice"] == 1
