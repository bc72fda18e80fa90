"""A consumer's pool warms each new session (issue #37): its first claim
cost 13-18 ms (statement prepared, the claim function's plans made) where
later ones cost 0.6 ms, and a job delivered to a fresh session waited that
long to start (bench/idle_cost.py). The warm-up claims an id no row has and
completes another: it must take nothing, even with better jobs waiting (a
claim's swap needs the delivered row), and leave both statements prepared
on the session, so the first real job finds them ready."""

from __future__ import annotations

import asyncio

import asyncpg

from jobq.settings import Settings
from jobq.sql import Q
from jobq.worker.store import warm


def test_the_warm_up_takes_nothing_and_leaves_the_statements_ready(settings: Settings) -> None:
    async def go() -> None:
        setup = await asyncpg.connect(settings.database_url)
        conn = await asyncpg.connect(settings.database_url)
        try:
            await setup.execute("SELECT jobq.enqueue('work', '{}'::jsonb, priority => 5)")
            await setup.execute("SELECT jobq.enqueue('work', '{}'::jsonb)")
            await warm(conn, "warm-test", ["work"])
            assert await setup.fetchval(
                "SELECT count(*) FROM jobq.job WHERE status = 'queued' AND worker_id IS NULL") == 2
            prepared = {r["statement"] for r in await conn.fetch(
                "SELECT statement FROM pg_prepared_statements")}
            assert Q["claim"] in prepared and Q["complete"] in prepared
        finally:
            await conn.close()
            await setup.close()

    asyncio.run(go())
