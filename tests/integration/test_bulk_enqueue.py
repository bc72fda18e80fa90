"""Bulk enqueue through the relay (issue #37): ``publish_many(relay=True)``
returns at the commit, with nothing on the broker yet, and wakes the
reapers, whose relay publishes every id, each once. From the async and the
sync client."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from jobq.client.producer import Client
from jobq.client.sync import SyncClient
from jobq.newjob import NewJob
from jobq.reaper import Reaper
from jobq.reaper.wakes import Wakes
from jobq.settings import Settings
from tests.integration.test_idle_wakes import run
from tests.integration.test_publish import broker_ids

N = 2_000
LONG_SLEEP_S = 20.0


def test_a_bulk_enqueue_returns_at_the_commit_and_the_relay_publishes_it(
        settings: Settings) -> None:
    async def check(reaper: Reaper, wakes: Wakes, conn: asyncpg.Connection) -> None:
        async with Client(settings) as client:
            # An idle reaper is woken by the commit (jobq_relay).
            wakes.before_probe()
            assert wakes.sleep_for(await reaper.probe()) == settings.reaper.idle_sleep_s
            # A sleep far longer than the idle one, so that only a wake ends it
            # early, however long the 2,000-row insert takes on a busy machine.
            sleeping = asyncio.create_task(wakes.sleep(LONG_SLEEP_S))
            started = time.monotonic()
            ids = await client.publish_many(
                [NewJob("bulk", {"n": i}) for i in range(N)], relay=True)
            committed = time.monotonic()
            await sleeping
            woke = time.monotonic()
            assert wakes.told and woke - started < LONG_SLEEP_S / 2, (
                f"the bulk commit woke no reaper (slept {woke - started:.2f}s)")
            # Soon after the commit: within what the insert itself took (or 1 s).
            assert woke - committed < max(1.0, committed - started), (
                f"woken {woke - committed:.2f}s after the commit")
        row = await conn.fetchrow(
            "SELECT count(*) AS n, count(*) FILTER (WHERE published_at IS NULL "
            "AND relay_after <= now()) AS relays FROM jobq.job WHERE id = ANY($1)", ids)
        assert row is not None and row["n"] == N and row["relays"] == N, row
        assert await broker_ids(settings, "bulk") == [], "published by the producer"
        while (await reaper.run_once(await reaper.probe())).published:
            pass
        on_broker = await broker_ids(settings, "bulk")
        assert sorted(on_broker) == sorted(map(str, ids)), "not every id once"

    run(settings, check)


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
        waiting = {r["id"] for r in rows if r["waiting"]}
        assert waiting == {child}, "the dependant is not waiting for its parent"
        assert await broker_ids(settings, "bulk_sync") == [str(plain[0])]  # the plain one only

    asyncio.run(check())
