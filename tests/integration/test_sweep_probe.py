"""The reaper's probe (issue #37): one statement says which duties of a sweep
have anything to do, and the loop runs only those. For every state a duty
acts on, the probe must say so, and a sweep run on that probe must do the
work; with nothing to do it must say idle, so an idle fleet costs the
database one probe per loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg

from jobq.client.producer import Client
from jobq.ops.schedule_admin import set_schedule
from jobq.reaper import Reaper
from jobq.schedules import Schedule
from jobq.settings import Settings


def run(settings: Settings, check: Callable[[Reaper, asyncpg.Connection, Client],
                                            Awaitable[None]]) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(settings.database_url)
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        try:
            async with Client(settings) as client:
                await check(reaper, conn, client)
        finally:
            await reaper.close()
            await conn.close()

    asyncio.run(go())


def test_an_empty_database_is_idle_with_nothing_pending(settings: Settings) -> None:
    async def check(reaper: Reaper, conn: asyncpg.Connection, client: Client) -> None:
        probe = await reaper.probe()
        assert probe.idle and probe.seconds is None, probe
        assert (await reaper.run_once(probe)).published == 0

    run(settings, check)


def test_a_sql_enqueue_is_relay_due_and_the_probed_sweep_publishes_it(
        settings: Settings) -> None:
    async def check(reaper: Reaper, conn: asyncpg.Connection, client: Client) -> None:
        await conn.fetchval("SELECT jobq.enqueue('reports', '{}'::jsonb)")
        probe = await reaper.probe()
        assert probe.relay_due and not probe.idle, probe
        assert (await reaper.run_once(probe)).published == 1
        assert (await reaper.probe()).idle

    run(settings, check)


def test_a_delayed_job_is_not_due_but_sets_the_wake_up(settings: Settings) -> None:
    async def check(reaper: Reaper, conn: asyncpg.Connection, client: Client) -> None:
        await client.publish("mail", {}, delay_s=30)
        probe = await reaper.probe()
        assert probe.idle, probe
        assert probe.seconds is not None and 25 < probe.seconds <= 30, probe

    run(settings, check)


def test_a_lapsed_lease_is_active_and_the_probed_sweep_requeues_and_publishes_it(
        settings: Settings) -> None:
    async def check(reaper: Reaper, conn: asyncpg.Connection, client: Client) -> None:
        jid = await client.publish("mail", {})
        await conn.execute("UPDATE jobq.job SET status = 'active', worker_id = 'w-gone', "
                           "lock = gen_random_uuid(), attempts = 1, "
                           "lease_expires_at = now() - interval '1 second' WHERE id = $1", jid)
        probe = await reaper.probe()
        assert probe.active and probe.seconds is not None and probe.seconds < 0, probe
        sweep = await reaper.run_once(probe)
        assert sweep.requeued == [str(jid)] and sweep.published == 1, sweep

    run(settings, check)


def test_a_vanished_worker_is_cut_by_the_probed_sweep(settings: Settings) -> None:
    async def check(reaper: Reaper, conn: asyncpg.Connection, client: Client) -> None:
        await conn.execute("INSERT INTO jobq.worker (worker_id, host, pid, lock_key) "
                           "VALUES ('w-dead', 'h', 1, 424242)")  # nobody holds that lock
        probe = await reaper.probe()
        assert probe.vanished and not probe.active, probe
        assert (await reaper.run_once(probe)).vanished == ["w-dead"]
        assert (await reaper.probe()).idle

    run(settings, check)


def test_a_parked_job_is_unparked_and_published_in_the_same_sweep(settings: Settings) -> None:
    async def check(reaper: Reaper, conn: asyncpg.Connection, client: Client) -> None:
        jid = await client.publish("mail", {})
        # as a claim refused by a limit leaves it: unpublished, relay_after infinity
        await conn.execute("UPDATE jobq.job SET published_at = NULL, "
                           "relay_after = 'infinity' WHERE id = $1", jid)
        probe = await reaper.probe()
        assert probe.parked and not probe.relay_due, probe
        assert (await reaper.run_once(probe)).published == 1

    run(settings, check)


def test_a_due_schedule_slot_is_fired_and_published_in_the_same_sweep(
        settings: Settings) -> None:
    async def check(reaper: Reaper, conn: asyncpg.Connection, client: Client) -> None:
        await set_schedule(conn, Schedule("tick", "reports", {}, every_s=60))
        await conn.execute("UPDATE jobq.schedule SET next_run_at = now() - interval '1 s'")
        probe = await reaper.probe()
        assert probe.schedules_due, probe
        assert (await reaper.run_once(probe)).published == 1
        assert await conn.fetchval("SELECT count(*) FROM jobq.job WHERE queue = 'reports'") == 1

    run(settings, check)
