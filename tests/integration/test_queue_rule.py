"""A job's queue exists as long as the job does (schema 0021): the rule of
the foreign key it replaced, checked per statement, with the key's locks.
Every way SQL could break it is refused, and a queue delete racing an
enqueue either waits for it and refuses, or wins and the enqueue fails."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from jobq.db import open_pool
from jobq.errors import BadInput
from jobq.ops.admin import delete_queue

FK = asyncpg.exceptions.ForeignKeyViolationError
INSERT = ("INSERT INTO jobq.job (queue, payload, run_at, relay_after) "
          "SELECT q, '{}'::jsonb, now(), now() FROM unnest($1::text[]) q")


async def blocked_on_a_lock(conn: asyncpg.Connection) -> None:
    """Until another session of this database waits for a lock (not a sleep
    that a slow machine would outrun)."""
    for _ in range(500):
        if await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                               "current_database() AND wait_event_type = 'Lock'"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no session waited for a lock")


def run(db_url: str, check) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        a, b = await asyncpg.connect(db_url), await asyncpg.connect(db_url)
        try:
            await a.execute("INSERT INTO jobq.queue (name) VALUES ('kept'), ('empty')")
            await check(a, b)
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_sql_cannot_leave_a_job_without_its_queue(db_url: str) -> None:
    async def check(a: asyncpg.Connection, _b: asyncpg.Connection) -> None:
        with pytest.raises(FK, match='queue "nowhere" does not exist'):
            await a.execute(INSERT, ["kept", "nowhere", "kept"])
        assert await a.fetchval("SELECT count(*) FROM jobq.job") == 0  # the statement, all of it
        await a.execute(INSERT, ["kept"] * 3)
        with pytest.raises(FK, match="does not exist"):
            await a.execute("UPDATE jobq.job SET queue = 'nowhere'")
        await a.execute("UPDATE jobq.job SET queue = 'empty' WHERE ctid = "
                        "(SELECT min(ctid) FROM jobq.job)")  # to a queue that exists: fine
        for statement in ("DELETE FROM jobq.queue WHERE name = 'kept'",
                          "UPDATE jobq.queue SET name = 'renamed' WHERE name = 'kept'",
                          "TRUNCATE jobq.queue"):
            with pytest.raises(FK):
                await a.execute(statement)
        await a.execute("DELETE FROM jobq.queue WHERE name NOT IN ('kept', 'empty') "
                        "AND NOT EXISTS (SELECT 1 FROM jobq.job j WHERE j.queue = name)")
        assert await a.fetchval("SELECT count(*) FROM jobq.job WHERE queue IN "
                                "(SELECT name FROM jobq.queue)") == 3

    run(db_url, check)


def test_a_queue_delete_waits_for_an_enqueue_and_refuses(db_url: str) -> None:
    async def check(a: asyncpg.Connection, _b: asyncpg.Connection) -> None:
        pool = await open_pool(db_url, wait=False, max_size=1)
        try:
            tx = a.transaction()
            await tx.start()
            await a.fetchval("SELECT jobq.enqueue('empty', '{}'::jsonb)")  # not committed
            deleting = asyncio.create_task(delete_queue(pool, "empty"))
            await blocked_on_a_lock(a)  # the delete, on the enqueue's KEY SHARE
            assert not deleting.done()
            await tx.commit()
            with pytest.raises(BadInput):
                await deleting
            assert await a.fetchval("SELECT count(*) FROM jobq.job j JOIN jobq.queue q "
                                    "ON q.name = j.queue WHERE q.name = 'empty'") == 1
        finally:
            await pool.close()

    run(db_url, check)


def test_an_enqueue_racing_a_won_delete_fails_and_leaves_nothing(db_url: str) -> None:
    async def check(a: asyncpg.Connection, b: asyncpg.Connection) -> None:
        tx = a.transaction()
        await tx.start()
        await a.execute("DELETE FROM jobq.queue WHERE name = 'empty'")  # not committed
        inserting = asyncio.create_task(b.execute(INSERT, ["empty"]))
        await blocked_on_a_lock(a)  # the insert's check, on the delete's row lock
        assert not inserting.done()
        await tx.commit()
        with pytest.raises(FK, match="does not exist"):
            await inserting
        assert await a.fetchval("SELECT count(*) FROM jobq.job WHERE queue = 'empty'") == 0
        assert uuid.UUID(str(await a.fetchval("SELECT jobq.enqueue('kept', '{}'::jsonb)")))

    run(db_url, check)


def test_a_repeatable_read_delete_cannot_miss_a_job_committed_since_its_snapshot(
        db_url: str) -> None:
    async def check(a: asyncpg.Connection, b: asyncpg.Connection) -> None:
        for isolation in ("repeatable_read", "serializable"):
            late = b.transaction(isolation=isolation)
            await late.start()
            await b.fetchval("SELECT 1")  # its snapshot: before the job below
            tx = a.transaction()
            await tx.start()
            await a.execute(INSERT, ["empty"])
            deleting = asyncio.create_task(
                b.execute("DELETE FROM jobq.queue WHERE name = 'empty'"))
            await blocked_on_a_lock(a)  # on the insert's KEY SHARE
            await tx.commit()
            with pytest.raises(asyncpg.exceptions.SerializationError,
                               match="only in READ COMMITTED"):
                await deleting
            await late.rollback()
            assert await a.fetchval("SELECT count(*) FROM jobq.job j WHERE NOT EXISTS "
                                    "(SELECT 1 FROM jobq.queue q WHERE q.name = j.queue)") == 0
            await a.execute("DELETE FROM jobq.job")

    run(db_url, check)
