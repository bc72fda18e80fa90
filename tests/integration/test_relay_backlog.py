"""A relay backlog does not hold up lease detection (I3).

Tens of thousands of unpublished rows can be due at once: a bulk enqueue
handed to the relay, a SQL-only backfill, the rows written while the broker
was away. The relay publishes them at the broker's pace, seconds of work;
a reaper that did it all in one sweep requeued nothing meanwhile, and a job
whose worker died in that time came back seconds past its lease. A sweep's
relay has a time budget (``max_sleep_s``), and the loop comes straight back
for the rest after the probe and the requeue.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from jobq.reaper import Reaper
from jobq.settings import Settings

BACKLOG = 30_000  # at this machine's 6-10 k confirmed messages/s, 3-5 s of relay


def test_a_lapsed_lease_is_requeued_in_time_while_the_relay_has_a_backlog(
        settings: Settings) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(settings.database_url)
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        try:
            await conn.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('bulk', 30), "
                               "('short', 1)")
            jid = await conn.fetchval("SELECT jobq.enqueue('short', '{}'::jsonb, "
                                      "relay_grace_s => 3600)")
            # Nobody publishes these (grace 0): the relay's, all due now.
            await conn.execute(
                "SELECT jobq.enqueue_many(array_fill('bulk'::text, ARRAY[$1::int]), "
                "array_fill('{}'::jsonb, ARRAY[$1::int]), relay_grace_s => 0)", BACKLOG)
            # A claimed job whose worker is gone: its lease lapses in 1.5 s.
            deadline = await conn.fetchval(
                "UPDATE jobq.job SET status = 'active', lock = gen_random_uuid(), "
                "lease_expires_at = now() + interval '1.5 s' WHERE id = $1 "
                "RETURNING lease_expires_at", jid)
            loop = asyncio.create_task(reaper._loop())
            try:
                late, left = await requeued(conn, jid, deadline)
            finally:
                reaper.request_stop()
                await loop
            budget = settings.reaper.max_sleep_s
            assert late < 2 * budget + 0.3, (
                f"requeued {late:.2f}s after its lease lapsed, with {left} rows still to "
                "relay: the relay held up the requeue")
            assert 0 < left < BACKLOG, f"the relay was not busy when the lease lapsed ({left})"
        finally:
            await reaper.close()
            await conn.close()

    asyncio.run(go())


async def requeued(conn: asyncpg.Connection, jid: object, deadline: object
                   ) -> tuple[float, int]:
    """Seconds past ``deadline`` (database clock) at which the job was back
    in line, and how many bulk rows were then still unpublished."""
    give_up = time.monotonic() + 20
    while time.monotonic() < give_up:
        row = await conn.fetchrow(
            "SELECT status, extract(epoch FROM now() - $2::timestamptz)::float8 AS late "
            "FROM jobq.job WHERE id = $1", jid, deadline)
        assert row is not None
        if row["status"] != "active":
            left = await conn.fetchval("SELECT count(*) FROM jobq.job WHERE queue = 'bulk' "
                                       "AND published_at IS NULL")
            return float(row["late"]), int(left)
        await asyncio.sleep(0.02)
    raise AssertionError("the lapsed job was never requeued")
