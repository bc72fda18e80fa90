"""The producer's shared path (issue #16): concurrent publishes of one client
share a transaction, a refusal reaches its own caller only, marks are
deferred and written by close(), and jobq.enqueue_many's one-statement path
means what jobq.enqueue means row by row."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from harness.helpers import with_pool
from jobq.client.producer import Client
from jobq.errors import InvalidPayload
from jobq.newjob import NewJob
from jobq.ops import admin
from jobq.settings import Settings
from jobq.sql import Q


def test_concurrent_publishes_share_a_commit_and_a_refusal_stays_with_its_caller(
        settings: Settings) -> None:
    async def go() -> tuple[list[Any], int]:
        conn = await asyncpg.connect(settings.database_url)
        await conn.execute("INSERT INTO jobq.queue (name, max_payload_bytes) VALUES ('mail', 200)")
        async with Client(settings) as client:
            payloads: list[Any] = [{"n": i} for i in range(60)]
            payloads[17] = {"blob": "x" * 500}  # over the queue's 200 bytes
            got = await asyncio.gather(*(client.publish("mail", p) for p in payloads),
                                       return_exceptions=True)
        rows = await conn.fetch("SELECT payload, xmin::text AS tx FROM jobq.job")
        await conn.close()
        assert sorted(json.loads(r["payload"])["n"] for r in rows) == [
            i for i in range(60) if i != 17]
        return got, len({r["tx"] for r in rows})

    got, transactions = asyncio.run(go())
    assert isinstance(got[17], InvalidPayload), got[17]
    assert all(not isinstance(g, BaseException) for i, g in enumerate(got) if i != 17)
    print(f"59 concurrent publishes committed in {transactions} transaction(s)")
    assert transactions < 59 / 2  # group-committed, not one by one


def test_close_writes_the_pending_marks(settings: Settings) -> None:
    async def go() -> tuple[int, int]:
        async with Client(settings) as client:
            await asyncio.gather(*(client.publish("mail", {"n": i}) for i in range(40)))
        conn = await asyncpg.connect(settings.database_url)
        marked = await conn.fetchval("SELECT count(*) FROM jobq.job WHERE published_at IS NOT NULL")
        events = await conn.fetchval(
            "SELECT count(*) FROM jobq.job_event WHERE event = 'published'")
        await conn.close()
        return marked, events

    marked, events = asyncio.run(go())
    assert marked == 40  # the relay will not publish them again
    assert events == 0   # published_at says it; history keeps the relay's publishes only


@pytest.mark.parametrize("key", [None, "k-1"])
def test_the_batch_path_and_the_row_path_write_the_same_rows(settings: Settings,
                                                              key: str | None) -> None:
    """key=None: every row plain (one INSERT); key set: the batch takes the
    row-by-row path. Both must leave the same rows, events and timings."""
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(settings.database_url)
        await conn.execute("INSERT INTO jobq.queue (name) VALUES ('mail')")
        async with Client(settings) as client:
            ids = await client.publish_many([
                NewJob("mail", {"a": 1}, idempotency_key=key),
                NewJob("mail", None, delay_s=30),
                NewJob("mail", {"b": 2})])
        rows = await conn.fetch("""
            SELECT j.id, j.payload, j.status, j.idempotency_key,
                   extract(epoch FROM j.run_at - j.created_at)::int AS run_in,
                   extract(epoch FROM j.relay_after - j.created_at)::int AS relay_in,
                   (SELECT array_agg(e.event || coalesce(':' || e.detail, '') ORDER BY e.n)
                    FROM jobq.job_event e WHERE e.job_id = j.id) AS events,
                   (SELECT array_agg(h.event || coalesce(':' || h.detail, '') ORDER BY h.at, h.n)
                    FROM jobq.history h WHERE h.job_id = j.id) AS story
            FROM jobq.job j JOIN unnest($1::uuid[]) WITH ORDINALITY AS t(id, n) ON t.id = j.id
            ORDER BY t.n""", ids)
        await conn.close()
        return rows

    rows = asyncio.run(go())
    assert [json.loads(r["payload"]) for r in rows] == [{"a": 1}, {}, {"b": 2}]
    assert [r["idempotency_key"] for r in rows] == [key, None, None]
    assert [r["run_in"] for r in rows] == [0, 30, 0]
    grace = round(settings.producer.relay_grace_s)
    assert [r["relay_in"] for r in rows] == [grace, 30, grace]
    # Stored: only what the row does not keep (the delay asked for); told: all.
    assert [r["events"] for r in rows] == [None, ["enqueued:run in 30s"], None]
    assert [r["story"] for r in rows] == [["enqueued"], ["enqueued:run in 30s"], ["enqueued"]]


def test_a_batch_with_a_new_queue_or_a_repeated_key_goes_row_by_row(settings: Settings) -> None:
    async def go() -> tuple[list[Any], int]:
        async with Client(settings) as client:
            ids = await client.publish_many([
                NewJob("fresh", {"n": 1}), NewJob("fresh", {"n": 2}, idempotency_key="same"),
                NewJob("fresh", {"n": 3}, idempotency_key="same")])
            assert client.pool is not None
            queues = await client.pool.fetchval(
                "SELECT count(*) FROM jobq.queue WHERE name = 'fresh'")
        return ids, queues

    ids, queues = asyncio.run(go())
    assert queues == 1  # created on first use, as by jobq.enqueue
    assert ids[1] == ids[2] != ids[0]


def test_a_short_relay_grace_never_outruns_the_deferred_marks(settings: Settings) -> None:
    """relay_grace_s = 0.2 s: marks must land before the relay takes the rows
    for unpublished (a 0.25 s mark delay against it published every id twice)."""
    from jobq.reaper import Reaper
    from tests.integration.test_publish import broker_ids

    s = settings.model_copy(update={"producer": settings.producer.model_copy(
        update={"relay_grace_s": 0.2})})

    async def go() -> tuple[int, list[str]]:
        relayed = 0
        async with Client(s) as client:
            reaper = Reaper(s)
            await reaper.connect(wait=False)
            try:
                await asyncio.gather(*(client.publish("mail", {"n": i}) for i in range(30)))
                for _ in range(6):  # sweeps for 0.6 s while the client is still open
                    relayed += (await reaper.run_once()).published
                    await asyncio.sleep(0.1)
            finally:
                await reaper.close()
        return relayed, await broker_ids(s, "mail")

    relayed, bodies = asyncio.run(go())
    assert relayed == 0 and len(bodies) == 30, (relayed, len(bodies))


def test_publishes_go_on_after_the_producers_backends_are_terminated(settings: Settings) -> None:
    """While its backends are terminated, a publish in flight is refused (its
    caller is told, nothing is half-done); afterwards every publish succeeds:
    no broken connection stays in the pool. (It passed before the row commit
    went through db.fetch too: asyncpg noticed these terminations itself.)"""
    async def go() -> tuple[int, int, list[Any]]:
        killer = await asyncpg.connect(settings.database_url)
        refused = 0
        async with Client(settings) as client:
            async def kill() -> int:
                killed = 0
                for _ in range(40):
                    killed += await killer.fetchval(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = 'jobq-producer' AND datname = current_database()")
                    await asyncio.sleep(0.01)
                return killed

            async def publish_on() -> int:
                bad = 0
                for i in range(400):
                    try:
                        await client.publish("mail", {"n": i})
                    except Exception:
                        bad += 1  # in flight when its backend went: the caller is told
                return bad

            refused, killed = await asyncio.gather(publish_on(), kill())
            after = await asyncio.gather(*(client.publish("mail", {"after": i}) for i in range(20)),
                                         return_exceptions=True)
        await killer.close()
        return refused, killed, after

    refused, killed, after = asyncio.run(go())
    print(f"{killed} backend(s) terminated, {refused} publish(es) refused meanwhile")
    assert killed > 0, "no producer backend was terminated: the case was not exercised"
    assert [a for a in after if isinstance(a, BaseException)] == []


async def _cancel_then_retry(pool: asyncpg.Pool, job_id: Any) -> None:
    await admin.cancel(pool, job_id, "test")
    await admin.retry(pool, job_id)


async def _lost_by_the_broker(pool: asyncpg.Pool, job_id: Any) -> None:
    await pool.execute("UPDATE jobq.job SET published_at = now() - interval '1 minute', "
                       "run_at = now() - interval '61 s' WHERE id = $1", job_id)  # then due
    before = await pool.fetchval(Q["lost_horizon"], "q", 15.0, True)
    await pool.fetchval(Q["unpublish_lost"], "q", before, True)


@pytest.mark.parametrize("back_to_the_relay", [_cancel_then_retry, _lost_by_the_broker])
def test_a_late_mark_covers_only_the_spell_it_published(
        db_url: str, back_to_the_relay: Any) -> None:
    """The producer marks a confirmed id published up to a quarter second
    later, by the token of the queued spell it published. Whatever hands the
    row back to the relay meanwhile starts a new spell: the late mark must
    not cover it, or the row reads 'published' while no message is out, and
    only the lost-message check (15 s later) would find it."""
    async def body(pool: asyncpg.Pool) -> Any:
        job_id = await pool.fetchval("SELECT jobq.enqueue('q', '{}')")
        await back_to_the_relay(pool, job_id)
        await pool.execute(Q["mark_published"], [job_id], [None])  # the producer's, late
        return await pool.fetchrow("SELECT status, published_at IS NULL AS unpublished, "
                                   "relay_after <= now() AS due FROM jobq.job")

    row = with_pool(db_url, body)
    assert dict(row) == {"status": "queued", "unpublished": True, "due": True}


def test_a_repeated_key_does_not_mark_a_delayed_job_published(settings: Settings) -> None:
    """A publish whose idempotency key names a job delayed by an earlier
    publish gets that job's id back, and the producer sends the id (it asked
    for no delay). The consumer drops the early delivery (not due); the mark
    must not record it as published, or the relay, which publishes delayed
    jobs when due, would never send it."""
    async def go() -> Any:
        async with Client(settings) as client:
            first = await client.publish("mail", {"n": 1}, delay_s=60, idempotency_key="k")
            again = await client.publish("mail", {"n": 1}, idempotency_key="k")
        assert again == first
        conn = await asyncpg.connect(settings.database_url)
        row = await conn.fetchrow("SELECT status, published_at IS NULL AS unpublished, "
                                  "run_at > now() AS delayed FROM jobq.job")
        await conn.close()
        return row

    assert dict(asyncio.run(go())) == {"status": "queued", "unpublished": True, "delayed": True}
