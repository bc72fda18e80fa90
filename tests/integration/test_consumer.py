"""The consumer in-process against real PostgreSQL and RabbitMQ: retries,
handler signals, validation, timeouts, sync handlers, and bad input (I6)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import asyncpg
import pytest

from harness import apps
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.reaper import Reaper
from jobq.settings import Settings
from jobq.worker.consumer import Consumer


@pytest.fixture(autouse=True)
def _app_db(settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("JOBQ_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("JOBQ_TEST_RUNLOG", str(tmp_path))
    apps._pool = apps._creating = None  # the test app's pool belongs to another loop


class World:
    """A consumer and a reaper running in this event loop, plus a client."""

    def __init__(self, settings: Settings, consumer: Consumer, client: Client) -> None:
        self.settings = settings
        self.consumer = consumer
        self.client = client
        assert client.pool is not None
        self.pool: asyncpg.Pool = client.pool

    async def publish(self, queue: str, *payloads: Any) -> list[uuid.UUID]:
        return await self.client.publish_many([NewJob(queue, p) for p in payloads])

    async def row(self, jid: uuid.UUID) -> Any:
        return await self.pool.fetchrow("SELECT * FROM jobq.job WHERE id = $1", jid)

    async def wait_status(self, jid: uuid.UUID, status: str, timeout: float = 10) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while (row := await self.row(jid))["status"] != status:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"job {jid} still {row['status']}, wanted {status}: "
                                     f"{dict(row)}")
            await asyncio.sleep(0.02)
        return row

    async def raw(self, queue: str, body: bytes) -> None:
        """Publish a raw message into a job queue, as a buggy producer might."""
        conn = await aio_pika.connect(self.settings.amqp_url)
        try:
            ch = await conn.channel()
            ex = await ch.get_exchange(self.settings.namespace)
            await ex.publish(aio_pika.Message(body), routing_key=queue)
        finally:
            await conn.close()


def scenario(settings: Settings, body: Callable[[World], Awaitable[None]],
             queues: list[str] | None = None, **queue_settings: Any) -> None:
    async def go() -> None:
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
        for q in ("work", "other", "typed", "sync", "txn", "suicide"):
            await pool.execute("INSERT INTO jobq.queue (name) VALUES ($1) ON CONFLICT DO NOTHING",
                               q)
            for col, val in {"lease_s": 1.0, "backoff_base_s": 0.05, **queue_settings}.items():
                await pool.execute(f"UPDATE jobq.queue SET {col} = $2 WHERE name = $1", q, val)
        await pool.close()
        consumer = Consumer(apps.app, settings, queues or ["work", "typed", "sync", "txn"], 4)
        reaper = Reaper(settings)
        consumer_task = asyncio.create_task(consumer.run())
        reaper_task = asyncio.create_task(reaper.run())
        await asyncio.wait_for(consumer.ready.wait(), 15)
        client = Client(settings)
        await client.connect()
        try:
            await body(World(settings, consumer, client))
        finally:
            await client.close()
            consumer.request_stop()
            reaper.request_stop()
            await asyncio.wait_for(asyncio.gather(consumer_task, reaper_task), 20)
            if apps._pool is not None:
                await apps._pool.close()

    asyncio.run(go())


def test_handler_errors_retry_with_backoff_then_complete(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("work", {"fail_times": 2})
        row = await w.wait_status(jid, "completed")
        assert (row["attempts"], row["errors"], row["stalls"]) == (3, 2, 0)
        assert row["last_error"] == "RuntimeError: boom on attempt 2"

    scenario(settings, body)


def test_errors_past_max_attempts_fail_the_job_with_its_error(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("work", {"fail_times": 99})
        row = await w.wait_status(jid, "failed")
        assert (row["attempts"], row["errors"]) == (3, 3)
        assert row["last_error"] == "RuntimeError: boom on attempt 3"

    scenario(settings, body, max_attempts=3)


def test_retry_and_fail_signals(settings: Settings) -> None:
    async def body(w: World) -> None:
        retry, fail = await w.publish("work", {"retry_in": 0.3}, {"fail_now": True})
        row = await w.wait_status(fail, "failed")
        assert row["attempts"] == 1 and row["last_error"] == "Fail: cannot ever work"
        (step,) = await w.publish("work", {"bad_step": True})  # refused: the same every run
        row = await w.wait_status(step, "failed")
        assert row["attempts"] == 1 and row["last_error"].startswith("step refused: step 'bad'")
        row = await w.wait_status(retry, "completed")
        assert row["attempts"] == 2 and row["last_error"] == "Retry: come back later"
        assert (row["started_at"] - row["created_at"]).total_seconds() >= 0.3

    scenario(settings, body)


def test_payload_failing_validation_fails_at_once(settings: Settings) -> None:
    async def body(w: World) -> None:
        good, bad = await w.publish("typed", {"to": "a@b.c", "subject": "hi"}, {"to": "a@b.c"})
        await w.wait_status(good, "completed")
        row = await w.wait_status(bad, "failed")
        assert row["attempts"] == 1
        assert "payload failed validation for queue typed" in row["last_error"]
        assert "subject" in row["last_error"]

    scenario(settings, body)


def test_job_timeout_stops_a_live_but_hung_handler(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("work", {"sleep_first": 30})
        row = await w.wait_status(jid, "completed")
        assert row["attempts"] == 2 and row["stalls"] == 0 and row["errors"] == 1
        assert "timeout" in row["last_error"]
        outcomes = [r["outcome"] for r in await w.pool.fetch(
            "SELECT outcome FROM test_run WHERE job_id = $1 ORDER BY n", jid)]
        assert outcomes == ["cancelled", "returned"]

    scenario(settings, body, timeout_s=0.5)


def test_sync_handler_longer_than_the_lease_keeps_its_lease(settings: Settings,
                                                          tmp_path: Any) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("sync", {"sleep": 3.0})  # three leases long
        row = await w.wait_status(jid, "completed", timeout=15)
        assert row["attempts"] == 1 and row["stalls"] == 0
        with open(os.path.join(tmp_path, f"sync-{jid}")) as f:
            log = f.read().split("\n")
        assert log[0].startswith("start 1") and log[1] == "end"
        assert w.consumer.counters["lease_lost"] == 0

    scenario(settings, body)


def test_complete_in_the_handlers_transaction(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("txn", {})
        row = await w.wait_status(jid, "completed")
        assert await w.pool.fetchval("SELECT count(*) FROM test_run WHERE job_id = $1", jid) == 1
        assert row["attempts"] == 1
        # The row commits with the handler's transaction; the consumer's own
        # completion (which finds "already completed by me") follows.
        deadline = asyncio.get_running_loop().time() + 5
        while w.consumer.counters["completed"] != 1:
            assert asyncio.get_running_loop().time() < deadline, dict(w.consumer.counters)
            await asyncio.sleep(0.02)
        assert w.consumer.counters["lease_lost"] == 0

    scenario(settings, body)


def test_bad_messages_are_counted_and_never_stop_the_consumer(settings: Settings) -> None:
    async def body(w: World) -> None:
        (done,) = await w.publish("work", {})
        await w.wait_status(done, "completed")
        await w.raw("work", b"definitely not a job id")
        await w.raw("work", b"\xff\xfe")
        await w.raw("work", str(uuid.uuid4()).encode())  # no such row
        await w.raw("work", str(done).encode())  # duplicate delivery of a finished job
        (later,) = await w.publish("work", {})
        await w.wait_status(later, "completed")
        deadline = asyncio.get_running_loop().time() + 5
        c = w.consumer.counters
        while (c["malformed"], c["unknown_job"], c["duplicate"]) != (2, 1, 1):
            assert asyncio.get_running_loop().time() < deadline, dict(c)
            await asyncio.sleep(0.02)
        assert (await w.row(done))["attempts"] == 1  # the duplicate did not rerun it
        # Malformed bodies are dead-lettered for inspection, not lost.
        conn = await aio_pika.connect(w.settings.amqp_url)
        ch = await conn.channel()
        dead = await ch.get_queue(f"{w.settings.namespace}.dead")
        bodies = []
        while (m := await dead.get(fail=False, no_ack=True)) is not None:
            bodies.append(m.body)
        await conn.close()
        assert sorted(bodies) == sorted([b"definitely not a job id", b"\xff\xfe"])

    scenario(settings, body)


def test_id_published_to_the_wrong_queue_is_dropped_and_the_row_left_alone(
        settings: Settings) -> None:
    """A consumer acts only on rows it holds (issue #28 H2): an id delivered
    to the wrong queue is acked and dropped, counted and logged; the row is
    untouched and stays the relay's (or its producer's) to publish."""
    async def body(w: World) -> None:
        jid = await w.pool.fetchval("SELECT jobq.enqueue('other', '{}', 0, NULL, 3600)")
        before = await w.pool.fetchrow("SELECT lock, relay_after FROM jobq.job WHERE id = $1",
                                       jid)
        await w.raw("work", str(jid).encode())  # 'work' consumer, 'other' job
        deadline = asyncio.get_running_loop().time() + 5
        while w.consumer.counters["foreign_queue"] == 0:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        row = await w.row(jid)
        assert row["status"] == "queued" and row["attempts"] == 0
        after = await w.pool.fetchrow("SELECT lock, relay_after FROM jobq.job WHERE id = $1",
                                      jid)
        assert after is not None and before is not None and dict(after) == dict(before)

    scenario(settings, body)


def test_payload_reaches_the_handler_as_json(settings: Settings) -> None:
    async def body(w: World) -> None:
        sent = {"nested": {"a": [1, 2.5, None]}, "s": "ü\n", "t": True}
        (jid,) = await w.publish("echo", sent)
        await w.wait_status(jid, "completed")
        conn = await asyncpg.connect(w.settings.database_url)
        try:
            seen = await conn.fetchval("SELECT outcome FROM test_run WHERE job_id = $1", jid)
        finally:
            await conn.close()
        assert json.loads(seen) == {"type": "dict", "payload": sent}  # what the handler got

    scenario(settings, body, ["work", "echo"])


def test_a_sync_handler_reports_progress_from_its_thread(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("sync", {"progress": [1, {"done": 2, "of": 3}]})
        row = await w.wait_status(jid, "completed")
        assert row["progress"] is not None  # the first write landed at once
        assert json.loads(row["progress"]) in (1, {"done": 2, "of": 3})

    scenario(settings, body)
