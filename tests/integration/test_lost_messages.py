"""When the reaper takes a published row's message for lost (unpublish_lost):
with the broker queue empty, once it waited republish_after_s; with a
backlog, once consumers started a job published republish_after_s after it.
A backlog that is simply being worked through, oldest first, is left alone:
a republish there would only be a duplicate."""

from __future__ import annotations

from typing import Any

import asyncpg

from harness.helpers import with_pool
from jobq.sql import Q

AFTER = 15.0  # republish_after_s: the margin, and the window of "started recently"


async def _row(pool: asyncpg.Pool, published_ago: float, status: str = "queued",
               started_ago: float | None = None, finished_ago: float | None = None) -> Any:
    job_id = await pool.fetchval("SELECT jobq.enqueue('q', '{}')")
    await pool.execute(
        "UPDATE jobq.job SET published_at = now() - make_interval(secs => $2), status = $3, "
        "run_at = now() - make_interval(secs => $2 + 0.005), "  # due when it was published
        "started_at = now() - make_interval(secs => $4), "
        "finished_at = now() - make_interval(secs => $5) WHERE id = $1",
        job_id, published_ago, status, started_ago, finished_ago)
    return job_id


async def _republished(pool: asyncpg.Pool, empty: bool) -> set[Any]:
    before = await pool.fetchval(Q["lost_horizon"], "q", AFTER, empty)
    if before is not None:
        await pool.fetchval(Q["unpublish_lost"], "q", before, empty)
    rows = await pool.fetch("SELECT id FROM jobq.job WHERE status = 'queued' "
                            "AND published_at IS NULL")
    return {r["id"] for r in rows}


def _case(db_url: str, empty: bool, started: list[dict[str, Any]]) -> tuple[set[Any], Any, Any]:
    async def body(pool: asyncpg.Pool) -> tuple[set[Any], Any, Any]:
        await pool.execute("DELETE FROM jobq.job")
        old = await _row(pool, 60)
        recent = await _row(pool, 30)
        for s in started:
            await _row(pool, **s)
        return await _republished(pool, empty), old, recent

    result: tuple[set[Any], Any, Any] = with_pool(db_url, body)
    return result


def test_an_empty_broker_queue_makes_every_long_waiting_row_lost(db_url: str) -> None:
    got, old, recent = _case(db_url, True, [])
    assert got == {old, recent}


def test_a_backlog_with_nothing_overtaking_is_left_alone(db_url: str) -> None:
    # consumers are at work on rows published before the waiting ones
    got, _, _ = _case(db_url, False, [
        {"published_ago": 70, "status": "active", "started_ago": 1},
        {"published_ago": 65, "status": "completed", "started_ago": 2, "finished_ago": 1}])
    assert got == set()


def test_a_started_job_published_later_marks_the_rows_it_overtook(db_url: str) -> None:
    # a job published 20 s ago has started: rows published before 35 s ago
    # should have been delivered first, a row published 30 s ago may still be
    got, old, _ = _case(db_url, False, [
        {"published_ago": 20, "status": "active", "started_ago": 1}])
    assert got == {old}
    got, old, _ = _case(db_url, False, [
        {"published_ago": 20, "status": "completed", "started_ago": 2, "finished_ago": 1}])
    assert got == {old}


def test_only_recent_starts_count(db_url: str) -> None:
    # the overtaking job ran long ago: it says nothing about the queue now
    got, _, _ = _case(db_url, False, [
        {"published_ago": 20, "status": "completed", "started_ago": 40, "finished_ago": 39},
        {"published_ago": 20, "status": "active", "started_ago": 40}])
    assert got == set()


def test_candidates_are_queues_with_a_row_waiting_long_after_its_publish(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> list[str]:
        await pool.execute("INSERT INTO jobq.queue (name) VALUES ('fresh'), ('idle')")
        await _row(pool, 60)  # queue q
        fresh = await pool.fetchval("SELECT jobq.enqueue('fresh', '{}')")
        await pool.execute("UPDATE jobq.job SET published_at = now() WHERE id = $1", fresh)
        return [r["queue"] for r in await pool.fetch(Q["lost_candidates"], AFTER)]

    assert with_pool(db_url, body) == ["q"]
