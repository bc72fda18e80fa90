"""Publishing: row first, id second; delays, idempotency keys, the caller's
own transaction, and the relay for rows nobody published."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika
import aiormq
import asyncpg
import pytest

from jobq.client.producer import Client
from jobq.errors import InvalidPayload, InvalidQueue
from jobq.newjob import NewJob
from jobq.reaper import Reaper
from jobq.settings import Settings


async def broker_ids(settings: Settings, queue: str) -> list[str]:
    """Drain the job queue's messages (as any AMQP client could) and return
    the ids they carry, in order."""
    return [line for body in await broker_bodies(settings, queue)
            for line in body.split("\n")]


async def broker_bodies(settings: Settings, queue: str) -> list[str]:
    """Drain the job queue's messages and return their bodies."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        try:
            q = await ch.get_queue(f"{settings.namespace}.{queue}", ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return []  # never declared: nothing was ever published to it
        bodies = []
        while (msg := await q.get(fail=False, no_ack=True)) is not None:
            bodies.append(msg.body.decode())
        return bodies
    finally:
        await conn.close()


def test_publish_commits_the_row_then_publishes_the_id(settings: Settings) -> None:
    async def go() -> None:
        async with Client(settings) as client:
            jid = await client.publish("mail", {"to": "a@b.c"})
            ids = await client.publish_many([NewJob("mail", {"n": i}) for i in range(5)])
        # The marks are deferred (off the caller's path); close() writes them.
        conn = await asyncpg.connect(settings.database_url)
        row = await conn.fetchrow("SELECT * FROM jobq.job WHERE id = $1", jid)
        assert row is not None
        assert row["status"] == "queued" and row["published_at"] is not None
        assert json.loads(row["payload"]) == {"to": "a@b.c"}
        payloads = [json.loads(await conn.fetchval(
            "SELECT payload FROM jobq.job WHERE id = $1", i)) for i in ids]
        assert payloads == [{"n": i} for i in range(5)]  # ids in input order
        await conn.close()
        # The batch's ids went out together: one message, one id per line.
        assert await broker_bodies(settings, "mail") == [str(jid), "\n".join(map(str, ids))]

    asyncio.run(go())


def test_concurrent_publishes_of_one_client_share_their_messages(settings: Settings) -> None:
    async def go() -> tuple[list[str], list[str]]:
        async with Client(settings) as client:
            ids = await asyncio.gather(*(client.publish("mail", {"n": i}) for i in range(20)))
        return [str(i) for i in ids], await broker_bodies(settings, "mail")

    ids, bodies = asyncio.run(go())
    lines = [line for body in bodies for line in body.split("\n")]
    assert sorted(lines) == sorted(ids)  # every id once
    # The first goes alone; the rest wait for its commit and go out together.
    assert len(bodies) <= 3, f"{len(bodies)} messages for 20 concurrent publishes"


def test_idempotency_key_yields_one_job(settings: Settings) -> None:
    async def go() -> None:
        async with Client(settings) as client:
            a = await client.publish("mail", {"v": 1}, idempotency_key="order-42")
            b = await client.publish("mail", {"v": 2}, idempotency_key="order-42")
            c = await client.publish("mail", {"v": 3}, idempotency_key="order-43")
            assert a == b != c
            assert client.pool is not None
            assert await client.pool.fetchval("SELECT count(*) FROM jobq.job") == 2

    asyncio.run(go())


def test_delayed_job_is_published_by_the_relay_when_due(settings: Settings) -> None:
    async def go() -> None:
        async with Client(settings) as client:
            jid = await client.publish("mail", {}, delay_s=0.5)
            assert await broker_ids(settings, "mail") == []
            reaper = Reaper(settings)
            await reaper.connect(wait=False)
            try:
                assert (await reaper.run_once()).published == 0
                await asyncio.sleep(0.6)
                assert (await reaper.run_once()).published == 1
            finally:
                await reaper.close()
            assert await broker_ids(settings, "mail") == [str(jid)]

    asyncio.run(go())


def test_enqueue_in_callers_transaction_publishes_only_after_commit(settings: Settings) -> None:
    async def go() -> None:
        client = Client(settings)
        await client.connect()
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        conn = await asyncpg.connect(settings.database_url)
        try:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await client.enqueue(conn, "mail", {"x": 1})
                    raise RuntimeError("caller rolls back")
            assert await conn.fetchval("SELECT count(*) FROM jobq.job") == 0
            async with conn.transaction():
                jid = await client.enqueue(conn, "mail", {"x": 2})
                assert (await reaper.run_once()).published == 0  # not visible yet
            assert (await reaper.run_once()).published == 1
            assert await broker_ids(settings, "mail") == [str(jid)]
        finally:
            await conn.close()
            await reaper.close()
            await client.close()

    asyncio.run(go())


def test_sql_only_enqueue_is_relayed(settings: Settings) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(settings.database_url)
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        try:
            jid = await conn.fetchval("SELECT jobq.enqueue('reports', '{\"day\": 1}'::jsonb)")
            assert (await reaper.run_once()).published == 1
            assert (await reaper.run_once()).published == 0  # tracked, not republished
            assert await broker_ids(settings, "reports") == [str(jid)]
        finally:
            await reaper.close()
            await conn.close()

    asyncio.run(go())


def test_the_relay_spreads_a_handful_and_packs_a_backlog(settings: Settings) -> None:
    """A lapsed consumer's jobs come back through the relay together: one
    message each, so the whole fleet starts them at once; a backlog packed.
    Both in one sweep: each queue's ids are spread for that queue's fleet,
    whatever else the sweep carries (the sweep's total once packed the few
    8 to a message)."""
    async def go() -> tuple[list[str], list[str]]:
        conn = await asyncpg.connect(settings.database_url)
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        try:
            for queue, n in (("few", 8), ("many", 480)):
                await conn.execute(
                    "SELECT jobq.enqueue_many(array_fill($1::text, ARRAY[$2::int]), "
                    "array_fill('{}'::jsonb, ARRAY[$2::int]), array_fill(0::float8, "
                    "ARRAY[$2::int]), array_fill(NULL::text, ARRAY[$2::int]), 60)", queue, n)
            await conn.execute("UPDATE jobq.job SET relay_after = now()")  # due together
            assert (await reaper.run_once()).published == 488
            return await broker_bodies(settings, "few"), await broker_bodies(settings, "many")
        finally:
            await reaper.close()
            await conn.close()

    few, many = asyncio.run(go())
    assert len(few) == 8  # one id each
    assert len(many) == 16 and all(len(b.split("\n")) == 30 for b in many)


def test_ids_put_back_in_line_are_spread_a_producers_batch_packed(settings: Settings) -> None:
    """A consumer's releases (publish_and_mark, as a drain or an unpark
    calls it) reach the fleet one message each; a publish_many batch of the
    same size is one message."""
    async def go() -> tuple[list[str], list[str]]:
        async with Client(settings) as client:
            ids = await client.publish_many([NewJob("made", {}) for _ in range(8)])
            made = await broker_bodies(settings, "made")
            await client.republish([(i, "made", None) for i in ids])
            return made, await broker_bodies(settings, "made")

    made, back = asyncio.run(go())
    assert len(made) == 1 and len(back) == 8


@pytest.mark.parametrize("queue,payload,error", [
    ("bad queue", {}, InvalidQueue),
    ("", {}, InvalidQueue),
    ("mail", {"x": object()}, InvalidPayload),
    ("mail", {"x": float("nan")}, InvalidPayload),
    ("mail", {"blob": "x" * 1_100_000}, InvalidPayload),
])
def test_bad_input_is_refused_and_nothing_is_written(
    settings: Settings, queue: str, payload: Any, error: type[Exception]
) -> None:
    async def go() -> None:
        async with Client(settings) as client:
            with pytest.raises(error):
                await client.publish(queue, payload)
            assert client.pool is not None
            assert await client.pool.fetchval("SELECT count(*) FROM jobq.job") == 0

    asyncio.run(go())


def test_a_payload_over_its_queues_limit_never_crosses_the_wire(settings: Settings) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(settings.database_url)
        await conn.execute("INSERT INTO jobq.queue (name, max_payload_bytes) "
                           "VALUES ('small', 1000)")
        async with Client(settings) as client:
            # The client's own refusal (the database's says "(store large ...)"):
            # the enqueue statement that would carry 200 kB never ran.
            with pytest.raises(InvalidPayload, match="limit of queue small; store large"):
                await client.publish("small", {"blob": "x" * 200_000})
            # Under 64 KiB there is no lookup: the database refuses it, exactly.
            with pytest.raises(InvalidPayload, match=r"limit of queue small \(store large"):
                await client.publish("small", {"blob": "x" * 5_000})
            assert await conn.fetchval("SELECT count(*) FROM jobq.job") == 0
            ok = await client.publish("small", {"blob": "x" * 100})
            assert ok is not None
        await conn.close()

    asyncio.run(go())
