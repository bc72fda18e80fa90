"""Bulk enqueue through the relay (issue #37): ``publish_many(relay=True)``
returns at the commit, with nothing on the broker yet, and wakes the
reapers, whose relay publishes every id. From the async and the sync client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aio_pika
import asyncpg

from jobq.producer import Client, NewJob
from jobq.reaper import Reaper
from jobq.reaper.wakes import Wakes
from jobq.settings import Settings
from jobq.sync_client import SyncClient

N = 2_000


async def depth(settings: Settings, queue: str) -> int:
    """Messages ready in the broker's queue for ``queue``."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        q = await (await conn.channel()).declare_queue(f"{settings.namespace}.{queue}",
                                                        passive=True)
        return int(q.declaration_result.message_count or 0)
    finally:
        await conn.close()


async def until(check: Callable[[], Awaitable[object]], seconds: float = 10) -> bool:
    for _ in range(int(seconds / 0.05)):
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


async def eq(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def test_a_bulk_enqueue_returns_at_the_commit_and_the_relay_publishes_it(
        settings: Settings) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(settings.database_url)
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        wakes = Wakes(settings.session_url, settings.reaper)
        await wakes.listen()
        try:
            async with Client(settings) as client:
                warm = await client.publish("bulk", {"warm": True})  # the queue, declared
                assert await until(lambda: conn.fetchval(  # marked: nothing for the relay
                    "SELECT published_at IS NOT NULL FROM jobq.job WHERE id = $1", warm))
                # An idle reaper is woken by the commit (jobq_relay).
                wakes.before_probe()
                sleep_s = wakes.sleep_for(await reaper.probe())
                assert sleep_s == settings.reaper.idle_sleep_s
                sleeping = asyncio.create_task(wakes.sleep(sleep_s))
                started = time.monotonic()
                ids = await client.publish_many(
                    [NewJob("bulk", {"n": i}) for i in range(N)], relay=True)
                await sleeping
                assert time.monotonic() - started < 1.0, "the bulk commit woke no reaper"
            assert len(set(ids)) == N
            row = await conn.fetchrow(
                "SELECT count(*) AS n, count(*) FILTER (WHERE published_at IS NULL "
                "AND relay_after <= now()) AS relays FROM jobq.job WHERE id = ANY($1)", ids)
            assert row is not None and row["n"] == N and row["relays"] == N, row
            assert await depth(settings, "bulk") == 1, "published by the producer, not the relay"
            while (await reaper.run_once(await reaper.probe())).published:
                pass
            left = await conn.fetchval("SELECT count(*) FROM jobq.job WHERE id = ANY($1) "
                                       "AND published_at IS NULL", ids)
            assert left == 0
            assert await until(lambda: eq(depth(settings, "bulk"), N + 1))
        finally:
            await wakes.close()
            await reaper.close()
            await conn.close()

    asyncio.run(go())


def test_the_sync_client_hands_a_bulk_enqueue_to_the_relay(settings: Settings) -> None:
    with SyncClient(settings) as client:
        ids = client.publish_many([NewJob("bulk_sync", i) for i in range(10)], relay=True)
        plain = client.publish_many([NewJob("bulk_sync", "now")])
        # A dependant in a bulk: it waits for its parent, published by nobody yet.
        (child,) = client.publish_many([NewJob("bulk_sync", "child", after=(ids[0],))],
                                       relay=True)

    async def check() -> None:
        conn = await asyncpg.connect(settings.database_url)
        try:
            rows = await conn.fetch("SELECT id, published_at IS NULL AND relay_after <= now() "
                                    "AS relays, waiting_on = 1 AND relay_after = 'infinity' "
                                    "AS waiting FROM jobq.job WHERE queue = 'bulk_sync'")
        finally:
            await conn.close()
        relays = {r["id"] for r in rows if r["relays"]}
        assert relays == set(ids), "the bulk rows are the relay's, the plain one is not"
        assert set(plain).isdisjoint(relays)
        waiting = {r["id"] for r in rows if r["waiting"]}
        assert waiting == {child}, "the dependant is not waiting for its parent"
        assert await depth(settings, "bulk_sync") == 1  # the plain publish only

    asyncio.run(check())
