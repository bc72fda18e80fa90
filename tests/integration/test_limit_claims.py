"""The claim decides queue limits (issue #17), on a real database: how many
of a batch one claim takes under max_running and rate_per_s, what happens to
the rest (parked, then released by unpark), and that a limit which does not
bind takes the whole batch (it once let one job through per claim)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import with_pool
from jobq import lease
from jobq.db import execute
from jobq.sql import Q


async def unpark(pool: asyncpg.Pool) -> int:
    """What one sweep of the reapers' unpark duty releases."""
    return int((await execute(pool, Q["unpark"])).split()[-1])


async def _batch(pool: asyncpg.Pool, n: int, **queue: Any) -> list[uuid.UUID]:
    await pool.execute("INSERT INTO jobq.queue (name) VALUES ('lim') ON CONFLICT DO NOTHING")
    for col, val in queue.items():
        await pool.execute(f"UPDATE jobq.queue SET {col} = $1 WHERE name = 'lim'", val)
    return [await pool.fetchval("SELECT jobq.enqueue('lim', '{}')") for _ in range(n)]


async def _claimed(pool: asyncpg.Pool, ids: list[uuid.UUID]) -> int:
    rows = await lease.claim(pool, ids, "w", ["lim"])
    return sum(r is not None for r in rows)


@pytest.mark.parametrize(("settings", "taken"), [
    ({}, 10),
    ({"max_running": 1000}, 10),  # does not bind: the whole batch
    ({"max_running": 3}, 3),
    ({"rate_per_s": 1000}, 10),
    ({"rate_per_s": 2, "rate_tokens": 0}, 0),  # an empty bucket (refills at 2/s)
])
def test_one_claim_takes_what_the_limit_allows_and_parks_the_rest(
        db_url: str, settings: dict[str, Any], taken: int) -> None:
    async def body(pool: asyncpg.Pool) -> tuple[int, int]:
        if "rate_tokens" in settings:
            await pool.execute("INSERT INTO jobq.queue (name) VALUES ('lim')")
            await pool.execute("UPDATE jobq.queue SET rate_at = now() WHERE name = 'lim'")
        ids = await _batch(pool, 10, **settings)
        got = await _claimed(pool, ids)
        parked = await pool.fetchval("SELECT count(*) FROM jobq.job WHERE status = 'queued' "
                                     "AND published_at IS NULL AND relay_after = 'infinity'")
        return got, parked

    got, parked = with_pool(db_url, body)
    assert got == taken and parked == 10 - taken


def test_parked_jobs_are_released_as_slots_free(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> list[int]:
        ids = await _batch(pool, 6, max_running=2)
        rows = await lease.claim(pool, ids, "w", ["lim"])
        held = [r for r in rows if r is not None]
        steps = [await unpark(pool)]  # no slot free: nothing released
        await pool.execute("UPDATE jobq.job SET status = 'completed' WHERE id = $1",
                           held[0].id)
        steps.append(await unpark(pool))  # one slot: one job
        await pool.execute("UPDATE jobq.queue SET max_running = NULL WHERE name = 'lim'")
        steps.append(await unpark(pool))  # no limit any more: all the rest
        return steps

    assert with_pool(db_url, body) == [0, 1, 3]


def test_a_parked_jobs_delivery_is_decided_by_the_limit_again(db_url: str) -> None:
    """A stale delivery of a parked job goes through the same limit: held
    back while the limit binds, claimed once the limit is gone."""
    async def body(pool: asyncpg.Pool) -> list[int]:
        ids = await _batch(pool, 3, max_running=1)
        got = [await _claimed(pool, ids)]  # one runs, two parked
        got.append(await _claimed(pool, ids))  # delivered again: the limit still binds
        await pool.execute("UPDATE jobq.queue SET max_running = NULL WHERE name = 'lim'")
        got.append(await _claimed(pool, ids))  # no limit: the claim takes them
        return got

    assert with_pool(db_url, body) == [1, 0, 2]


def test_a_late_publish_mark_does_not_strand_a_parked_job(db_url: str) -> None:
    """The producer marks its confirmed ids published up to a quarter second
    after the confirm (Marks); a consumer may have parked one in between. The mark
    is for the spell that was published, not the parked one: the row stays
    unpublished, so unpark and the relay still bring it back (a stale mark
    once left parked rows 'published' with their messages acked, and a rate
    limited queue stopped until the lost-message check, 15 s later)."""
    async def body(pool: asyncpg.Pool) -> tuple[int, int]:
        ids = await _batch(pool, 3, max_running=1)
        await _claimed(pool, ids)  # one runs, two parked
        # The producer's deferred mark, with the token it read at enqueue.
        await pool.execute(Q["mark_published"], ids, [None] * len(ids))
        await pool.execute("UPDATE jobq.queue SET max_running = NULL WHERE name = 'lim'")
        return await unpark(pool), await pool.fetchval(
            "SELECT count(*) FROM jobq.job WHERE status = 'queued' AND published_at IS NULL "
            "AND relay_after <= now()")

    assert with_pool(db_url, body) == (2, 2)
