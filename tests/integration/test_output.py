"""Streamed output (issue #52, item 5; schema 0033): a running handler's
job.emit chunks reach client.stream in order as they are emitted (a reader
started before the job waits for them), a re-run's chunks come after a
RunBoundary, a reader resumes from an offset, the stream ends when the job
ends; sync handlers emit too, SyncClient streams. An emit is fenced by the
lease (nothing stored for a stale token) and by the queue's payload limit;
chunks are pruned with the job. Real consumer and reaper."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from jobq import Chunk, RunBoundary, SyncClient, UnknownJob
from jobq.amqp.broker import Broker
from jobq.reaper.store import PgReaperStore
from jobq.settings import Settings
from jobq.sql import Q
from tests.integration.test_consumer import World, _app_db, scenario  # noqa: F401


async def _read(w: World, jid: uuid.UUID, offset: int = 0) -> list[Any]:
    return [item async for item in w.client.stream(jid, from_offset=offset)]


def _chunks(items: list[Any]) -> list[tuple[int, int, int]]:
    return [(c.offset, c.data["i"], c.attempt) for c in items if isinstance(c, Chunk)]


def test_a_reader_gets_every_chunk_in_order_across_a_retry_and_resumes(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        await w.pool.execute("INSERT INTO jobq.queue (name, backoff_base_s) VALUES ('emits', 0.05) "
                             "ON CONFLICT (name) DO UPDATE SET backoff_base_s = 0.05")
        (jid,) = await w.publish("emits", {"chunks": 3, "every": 0.05, "fail_first": True})
        items = await asyncio.wait_for(_read(w, jid), 30)  # started before the first chunk
        assert (await w.row(jid))["status"] == "completed"
        assert _chunks(items) == [(1, 0, 1), (2, 1, 1), (3, 2, 1), (4, 0, 2), (5, 1, 2),
                                  (6, 2, 2)]
        assert [type(i).__name__ for i in items].count("RunBoundary") == 1
        assert items[3] == RunBoundary(2)  # where the retry's output starts
        later = await _read(w, jid, offset=4)  # a reader resuming after offset 4
        assert _chunks(later) == [(5, 1, 2), (6, 2, 2)]
        assert await _read(w, jid, offset=6) == []
        with pytest.raises(UnknownJob):
            await _read(w, uuid.uuid4())

    scenario(settings, body, queues=["emits"])


def test_sync_handlers_emit_and_the_sync_client_streams(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("emits_sync", {"chunks": 4, "every": 0.02})
        got = await asyncio.to_thread(_sync_read, settings, jid)
        assert [(c.offset, c.data["i"]) for c in got] == [(1, 0), (2, 1), (3, 2), (4, 3)]

    scenario(settings, body, queues=["emits_sync"])


def _sync_read(settings: Settings, jid: uuid.UUID) -> list[Any]:
    with SyncClient(settings) as client:
        return list(client.stream(jid))


def test_an_emit_is_fenced_bounded_and_pruned_with_its_job(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("emits", {"chunks": 2})
        await w.wait_status(jid, "completed")
        run = await w.pool.fetchval("SELECT lock FROM jobq.job WHERE id = $1", jid)
        late = await w.pool.fetchrow(Q["output_emit"], jid, run, '{"late": 1}', 10_000)
        assert late is not None  # the run ended: nothing stored
        assert not late["ours"] and late["n"] is None
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job_output") == 2
        # a live lease, a chunk over the queue's limit: refused, not stored
        await w.pool.execute("UPDATE jobq.queue SET max_payload_bytes = 1024 "
                             "WHERE name = 'emits'")
        await w.pool.execute("UPDATE jobq.job SET status = 'active', lease_expires_at = "
                             "now() + interval '1 min' WHERE id = $1", jid)
        big = await w.pool.fetchrow(Q["output_emit"], jid, run, '"' + "x" * 2000 + '"',
                                    10_000)
        assert big is not None and big["ours"] and big["n"] is None
        capped = await w.pool.fetchrow(Q["output_emit"], jid, run, '"ok"', 2)  # the cap
        assert capped is not None
        assert capped["ours"] and capped["n"] is None and capped["before"] == 2
        await w.pool.execute("UPDATE jobq.job SET status = 'completed', finished_at = "
                             "now() - interval '1 day', lease_expires_at = NULL WHERE id = $1",
                             jid)
        await w.pool.execute("UPDATE jobq.queue SET keep_completed_s = 60 WHERE name = 'emits'")
        store = PgReaperStore(w.pool, Broker("", "unused"))
        assert await store.prune_finished(100) == 1
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job_output") == 0

    scenario(settings, body, queues=["emits"])
