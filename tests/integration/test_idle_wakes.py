"""An idle reaper sleeps longer (issue #37), and that must cost nothing it
promises: the sleep never outlasts the shortest queue lease (I3 from the
last renewal), and a delayed enqueue, through SQL or the client, wakes a
reaper sleeping past its due time (schema 0020), as a new schedule does, while a busy one, which
probes within max_sleep_s anyway, is not woken by each of a stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg

from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.ops.schedule_admin import set_schedule
from jobq.reaper import Reaper
from jobq.reaper.wakes import Wakes
from jobq.schedules import Schedule
from jobq.settings import Settings

LONG_S = 30.0
IDLE_S = 2.0  # the default idle_sleep_s; the settings fixture's max_sleep_s is 0.2


def run(settings: Settings,
        check: Callable[[Reaper, Wakes, asyncpg.Connection], Awaitable[None]]) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(settings.database_url)
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        wakes = Wakes(settings.session_url, settings.reaper)
        await wakes.listen()
        try:
            await check(reaper, wakes, conn)
        finally:
            await wakes.close()
            await reaper.close()
            await conn.close()

    asyncio.run(go())


async def slept(wakes: Wakes, seconds: float, during: Callable[[], Awaitable[object]]) -> float:
    """How long a sleep of ``seconds`` lasted when ``during`` ran inside it."""
    started = time.monotonic()
    sleep = asyncio.create_task(wakes.sleep(seconds))
    await asyncio.sleep(0.1)
    await during()
    await sleep
    return time.monotonic() - started


def test_idle_the_reaper_sleeps_longer_but_never_past_the_shortest_lease(
        settings: Settings) -> None:
    assert settings.reaper.idle_sleep_s == IDLE_S and settings.reaper.max_sleep_s < IDLE_S

    async def check(reaper: Reaper, wakes: Wakes, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('slow', 30)")
        wakes.before_probe()
        probe = await reaper.probe()
        assert probe.idle and probe.min_lease_s is not None and probe.min_lease_s >= IDLE_S, probe
        assert wakes.sleep_for(probe) == IDLE_S
        # A queue of 1 s leases: a job claimed right after this probe lapses
        # 1 s later at the earliest, so the reaper must look again by then.
        await conn.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('quick', 1)")
        probe = await reaper.probe()
        assert probe.min_lease_s == 1 and wakes.sleep_for(probe) == 1.0
        # Busy: a job is active, the pace is max_sleep_s again.
        await conn.execute("UPDATE jobq.queue SET lease_s = 30 WHERE name = 'quick'")
        jid = await conn.fetchval("SELECT jobq.enqueue('slow', '{}'::jsonb)")
        await conn.execute("UPDATE jobq.job SET status = 'active', lock = gen_random_uuid(), "
                           "lease_expires_at = now() + interval '30 s' WHERE id = $1", jid)
        probe = await reaper.probe()
        assert not probe.idle and wakes.sleep_for(probe) == settings.reaper.max_sleep_s

    run(settings, check)


def test_a_delayed_enqueue_wakes_an_idle_reaper(settings: Settings) -> None:
    async def check(reaper: Reaper, wakes: Wakes, conn: asyncpg.Connection) -> None:
        async with Client(settings) as client:
            for how, enqueue in (
                ("SQL", lambda: conn.fetchval(
                    "SELECT jobq.enqueue('mail', '{}'::jsonb, delay_s => 0.3)")),
                ("publish", lambda: client.publish("mail", {}, delay_s=0.3)),
                ("publish_many", lambda: client.publish_many(
                    [NewJob("mail", {}), NewJob("mail", {}, delay_s=0.3)])),
                ("a schedule", lambda: set_schedule(  # first slot: now + 1 s
                    conn, Schedule("tick", "mail", {}, every_s=1))),
            ):
                await reaper.relay()  # what is due now is published
                wakes.before_probe()
                probe = await reaper.probe()
                sleep_s = wakes.sleep_for(probe)
                assert sleep_s == IDLE_S, (how, probe)
                # A sleep far longer than the idle one, so that only a wake
                # ends it early, however loaded the machine.
                took = await slept(wakes, LONG_S, enqueue)
                assert took < LONG_S / 2, f"{how}: a delayed enqueue left the reaper asleep"
                # Awake, it knows what is coming, and publishes it when due.
                wakes.before_probe()
                assert (await reaper.probe()).seconds is not None, how
                # Until nothing this step enqueued is pending: publish_many's
                # immediate job could be the relay's first catch and its
                # delayed one still 0.6 s away when the next step looked
                # (CI: the schedule step found seconds=0.61, not idle).
                published, deadline = 0, time.monotonic() + 5
                while time.monotonic() < deadline:
                    wakes.before_probe()
                    probe = await reaper.probe()
                    settled = probe.seconds is None or how == "a schedule"  # it ticks on
                    if published and settled and not probe.relay_due:
                        break
                    await asyncio.sleep(wakes.sleep_for(probe))
                    published += (await reaper.run_once(await reaper.probe())).published
                assert published >= 1, how
        await conn.execute("UPDATE jobq.schedule SET enabled = false")

    run(settings, check)


def test_a_busy_reaper_is_not_woken_by_each_delayed_enqueue(settings: Settings) -> None:
    async def check(reaper: Reaper, wakes: Wakes, conn: asyncpg.Connection) -> None:
        jid = await conn.fetchval("SELECT jobq.enqueue('slow', '{}'::jsonb)")
        await conn.execute("UPDATE jobq.job SET status = 'active', lock = gen_random_uuid(), "
                           "lease_expires_at = now() + interval '30 s' WHERE id = $1", jid)
        wakes.before_probe()
        sleep_s = wakes.sleep_for(await reaper.probe())
        assert sleep_s == settings.reaper.max_sleep_s
        took = await slept(wakes, sleep_s, lambda: conn.fetchval(
            "SELECT jobq.enqueue('mail', '{}'::jsonb, delay_s => 60)"))
        assert took >= sleep_s - 0.01
        for _ in range(100):  # the notification may still be on its way on a loaded machine
            if wakes.told:
                break
            await asyncio.sleep(0.02)
        # Told something is going on, its next sleep stays short even idle.
        await conn.execute("DELETE FROM jobq.job WHERE id = $1", jid)
        probe = await reaper.probe()
        assert probe.idle and wakes.sleep_for(probe) == settings.reaper.max_sleep_s

    run(settings, check)


def test_without_a_listen_session_there_is_no_long_sleep(settings: Settings) -> None:
    """The NOTIFYs are what make the idle sleep safe: a reaper that could not
    LISTEN keeps the busy pace."""
    async def check(reaper: Reaper, wakes: Wakes, conn: asyncpg.Connection) -> None:
        deaf = Wakes("postgresql://nobody@127.0.0.1:1/none", settings.reaper)
        await deaf.listen()  # refused: no session
        deaf.before_probe()
        probe = await reaper.probe()
        assert probe.idle
        assert wakes.sleep_for(probe) == IDLE_S
        assert deaf.sleep_for(probe) == settings.reaper.max_sleep_s

    run(settings, check)
