"""A job's end wakes its waiters: one NOTIFY on ``jobq_finished`` per watched
job, sent by a statement trigger that probes ``jobq.job_watch`` once for all
of a statement's rows (schema 0043, issue #49: the row trigger before it was
~0.04 ms of a completion's ~0.09 ms a job). The waiter still never writes the
job row (I11)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg

from harness.helpers import with_pool
from jobq.sql import Q

SENTINEL = "sentinel"


async def _claimed(pool: asyncpg.Pool, n: int) -> list[asyncpg.Record]:
    await pool.execute(Q["queue_ensure"], "watched")
    await pool.execute(
        "SELECT jobq.enqueue_many(array_fill('watched'::text, ARRAY[$1::int]), "
        "array_fill('{}'::jsonb, ARRAY[$1::int]), array_fill(0::float8, ARRAY[$1::int]), "
        "array_fill(NULL::text, ARRAY[$1::int]), 60)", n)
    ids = [r[0] for r in await pool.fetch("SELECT id FROM jobq.job ORDER BY id")]
    rows = await pool.fetch(Q["claim"], ids, "w-notify", ["watched"],
                            [uuid.uuid4() for _ in ids])
    assert len(rows) == n
    return sorted(rows, key=lambda r: r["id"])


async def _heard(db_url: str, pool: asyncpg.Pool, write: object) -> list[str]:
    """Payloads on jobq_finished while ``write()`` runs, up to a sentinel
    sent after it (notifications arrive in commit order)."""
    got: list[str] = []
    done = asyncio.Event()

    def on(_c: Any, _pid: int, _ch: str, payload: Any) -> None:
        got.append(payload)
        if payload == SENTINEL:
            done.set()

    listener = await asyncpg.connect(db_url)
    try:
        await listener.add_listener("jobq_finished", on)
        await write()  # type: ignore[operator]
        await pool.execute("SELECT pg_notify('jobq_finished', $1)", SENTINEL)
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await listener.close()
    return got[:-1]


def test_one_completion_of_several_jobs_wakes_exactly_the_watched_ones(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        rows = await _claimed(pool, 4)
        watched = {str(rows[0]["id"]), str(rows[2]["id"])}
        for jid in watched:
            await pool.fetch(Q["watch"], uuid.UUID(jid))

        async def complete() -> None:
            done = await pool.fetch(Q["complete"], [r["id"] for r in rows],
                                    [r["lock"] for r in rows], [None] * len(rows))
            assert len(done) == 4

        heard = await _heard(db_url, pool, complete)
        assert sorted(heard) == sorted(watched)  # each once, nobody else's

        async def touch_unwatched() -> None:  # a finished row nobody waits on
            await pool.execute("UPDATE jobq.job SET payload = payload WHERE id = $1",
                               rows[1]["id"])

        assert await _heard(db_url, pool, touch_unwatched) == []

    with_pool(db_url, body)


def test_a_renewal_wakes_nobody_a_final_failure_wakes_its_waiter(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        rows = await _claimed(pool, 2)
        await pool.fetch(Q["watch"], rows[1]["id"])

        async def renew() -> None:  # the watched job still runs: nobody is woken
            renewed = await pool.fetch(Q["renew"], [r["id"] for r in rows],
                                       [r["lock"] for r in rows], [30.0, 30.0], "w-notify")
            assert sorted(r["renewed"] for r in renewed) == [True, True]

        assert await _heard(db_url, pool, renew) == []

        async def fail() -> None:
            await pool.execute("UPDATE jobq.job SET status = 'failed', finished_at = now(), "
                               "last_error = 'x' WHERE id = ANY($1::uuid[])",
                               [r["id"] for r in rows])

        assert await _heard(db_url, pool, fail) == [str(rows[1]["id"])]

    with_pool(db_url, body)
