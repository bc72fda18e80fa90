"""A job's story (schema 0011): jobq.job_event keeps what the row does not
keep for good; jobq.history (and the ``history`` query behind ``jobq
inspect`` and the dashboard) adds 'enqueued' and 'completed' from the row."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from harness.helpers import with_pool as run
from jobq import lease
from jobq.lease import Failure, Lease
from jobq.sql import Q


async def claimed(pool: asyncpg.Pool, job_id: uuid.UUID, worker: str) -> Lease:
    (row,) = await lease.claim(pool, [job_id], worker, ["q"])
    assert row is not None
    return Lease.from_claim(row, 0.0, 0.15)


async def stored(pool: asyncpg.Pool, job_id: uuid.UUID) -> list[str]:
    return [r["event"] for r in await pool.fetch(
        "SELECT event FROM jobq.job_event WHERE job_id = $1 ORDER BY n", job_id)]


async def story(pool: asyncpg.Pool, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return [(r["event"], r["worker_id"], r["attempt"])
            for r in await pool.fetch(Q["history"], job_id)]


def test_a_happy_job_stores_one_event_and_tells_its_whole_story(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await pool.fetchval("SELECT jobq.enqueue('q', '{}')")
        assert await stored(pool, jid) == []
        assert await lease.complete(pool, [await claimed(pool, jid, "w1")]) == [True]
        assert await stored(pool, jid) == ["claimed"]
        assert await story(pool, jid) == [
            ("enqueued", None, None), ("claimed", "w1", 1), ("completed", "w1", 1)]
        view = await pool.fetch("SELECT event, queue FROM jobq.history WHERE job_id = $1 "
                                "ORDER BY at, n", jid)
        assert [(r["event"], r["queue"]) for r in view] == [
            ("enqueued", "q"), ("claimed", "q"), ("completed", "q")]

    run(db_url, body)


def test_every_attempt_keeps_its_own_events(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await pool.fetchval("SELECT jobq.enqueue('q', '{}', 5)")
        await pool.execute("UPDATE jobq.job SET run_at = now() WHERE id = $1", jid)
        first = await claimed(pool, jid, "w1")
        (row,) = await lease.fail(pool, [Failure(first, "boom", True, 0.0)])
        assert row is not None and row.status == "queued"
        assert await lease.complete(pool, [await claimed(pool, jid, "w2")]) == [True]
        assert await stored(pool, jid) == ["enqueued", "claimed", "retry", "claimed"]
        assert await story(pool, jid) == [
            ("enqueued", None, None), ("claimed", "w1", 1), ("retry", "w1", 1),
            ("claimed", "w2", 2), ("completed", "w2", 2)]
        event = (await pool.fetch(Q["history"], jid))[0]
        assert event["detail"] == "run in 5s"  # what the row no longer shows after the retry

    run(db_url, body)


def test_events_stored_before_0011_are_not_told_twice(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await pool.fetchval("SELECT jobq.enqueue('q', '{}')")
        le = await claimed(pool, jid, "w1")
        assert await lease.complete(pool, [le]) == [True]
        # A job finished by an older jobq stored both events itself.
        await pool.execute("INSERT INTO jobq.job_event (job_id, event, worker_id, attempt) "
                           "VALUES ($1, 'enqueued', NULL, NULL), ($1, 'completed', 'w1', 1)",
                           jid)
        assert sorted(e for e, _, _ in await story(pool, jid)) == [
            "claimed", "completed", "enqueued"]

    run(db_url, body)


def test_history_off_stores_nothing_and_the_row_still_tells(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        await pool.execute(Q["queue_ensure"], "q")
        await pool.execute("UPDATE jobq.queue SET history = false WHERE name = 'q'")
        jid = await pool.fetchval("SELECT jobq.enqueue('q', '{}', 5)")
        await pool.execute("UPDATE jobq.job SET run_at = now() WHERE id = $1", jid)
        assert await lease.complete(pool, [await claimed(pool, jid, "w1")]) == [True]
        assert await stored(pool, jid) == []
        assert [e for e, _, _ in await story(pool, jid)] == ["enqueued", "completed"]

    run(db_url, body)
