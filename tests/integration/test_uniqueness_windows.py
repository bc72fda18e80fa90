"""Uniqueness windows for idempotency keys (issue #51, item 4; schema 0032):
a key held while its job is live, or for N seconds after its publish; a
duplicate gets the holder's id, or is refused naming it. Three producers
racing on one key in open transactions make exactly one row; a producer's
open transaction on a key never holds up the worker of the key's job (I11).
From Python, SQL and the CLI; bad input gets one line."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, run_cli
from harness.helpers import with_pool as run
from jobq import DuplicateJob, lease
from jobq.amqp.broker import Broker
from jobq.client.producer import Client
from jobq.errors import InvalidPayload
from jobq.lease import Lease
from jobq.reaper.store import PgReaperStore
from jobq.settings import Settings
from tests.integration.test_cli import one_line_error

LIVE = "SELECT jobq.enqueue('u', '{}', idempotency_key => $1, idempotency_while_live => true)"


async def _finish(pool: asyncpg.Pool, jid: uuid.UUID) -> None:
    (claim,) = await lease.claim(pool, [jid], "w", ["u"])
    assert claim is not None
    assert await lease.complete(pool, [Lease.from_claim(claim, 0.0, 0.15)]) == [True]


def test_a_live_key_is_held_until_its_job_ends_then_makes_a_new_job(
        settings: Settings) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        async with Client(settings) as client:
            first = await client.publish("u", {"n": 1}, idempotency_key="k",
                                         idempotency_while_live=True)
            again = await client.publish("u", {"n": 2}, idempotency_key="k",
                                         idempotency_while_live=True)
            assert again == first
            await _finish(pool, first)
            fresh = await client.publish("u", {"n": 3}, idempotency_key="k",
                                         idempotency_while_live=True)
            assert fresh != first
            with pytest.raises(DuplicateJob) as refused:
                await client.publish("u", {}, idempotency_key="k", idempotency_while_live=True,
                                     on_duplicate="refuse")
            assert refused.value.job_id == fresh
        rows = await pool.fetch("SELECT id, idempotency_key, idempotency_scope FROM jobq.job "
                                "ORDER BY created_at")
        assert [(r["idempotency_key"], r["idempotency_scope"]) for r in rows] == \
            [("k", "live")] * 2  # both keep the key, for jobq inspect

    run(settings.database_url, body)


def test_a_window_holds_for_its_seconds_whatever_the_job_does(settings: Settings) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        sql = ("SELECT jobq.enqueue('u', '{}', idempotency_key => 'w', "
               "idempotency_window_s => 1)")
        first = await pool.fetchval(sql)
        assert await pool.fetchval(sql) == first
        for _ in range(300):  # until the database clock is past the window
            if await pool.fetchval("SELECT held_until < now() FROM jobq.job_unique"):
                break
            await asyncio.sleep(0.02)
        second = await pool.fetchval(sql)  # the first is still queued: a window is time
        assert second != first
        assert await pool.fetchval("SELECT count(*) FROM jobq.job WHERE status = 'queued'") == 2
        # the old way still holds for as long as the job is kept, and may refuse too
        kept = await pool.fetchval("SELECT jobq.enqueue('u', '{}', idempotency_key => 'kept')")
        with pytest.raises(asyncpg.UniqueViolationError, match=str(kept)):
            await pool.fetchval("SELECT jobq.enqueue('u', '{}', idempotency_key => 'kept', "
                                "on_duplicate => 'refuse')")

    run(settings.database_url, body)


async def _racers(url: str, key: str, n: int = 3) -> list[uuid.UUID]:
    """n producers, each in its own open transaction, publish one key and
    commit; the first commits only once the others wait on it. (A loser
    holds the key's hold row until it commits, as an insert into a unique
    index does: producers of one key take turns, nobody else waits.)"""
    conns = [await asyncpg.connect(url) for _ in range(n)]

    async def publish(conn: asyncpg.Connection) -> uuid.UUID:
        async with conn.transaction():
            got: uuid.UUID = await conn.fetchval(LIVE, key)
            return got

    try:
        tx = conns[0].transaction()
        await tx.start()
        first = await conns[0].fetchval(LIVE, key)
        others = [asyncio.ensure_future(publish(c)) for c in conns[1:]]
        for _ in range(200):  # until the others wait on the first's hold
            waiting = await conns[0].fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%idempotency_while_live%'")
            if waiting == n - 1:
                break
            await asyncio.sleep(0.02)
        assert not any(o.done() for o in others)
        await tx.commit()
        return [first, *await asyncio.wait_for(asyncio.gather(*others), 10)]
    finally:
        for c in conns:
            await c.close()


def test_three_producers_racing_on_a_key_make_one_row_now_and_after_it_ends(
        settings: Settings) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        got = await _racers(settings.database_url, "race")
        assert len(set(got)) == 1, got
        assert await pool.fetchval("SELECT count(*) FROM jobq.job") == 1
        await _finish(pool, got[0])
        again = await _racers(settings.database_url, "race")  # the take-over raced
        assert len(set(again)) == 1 and again[0] != got[0], again
        assert await pool.fetchval("SELECT count(*) FROM jobq.job") == 2

    run(settings.database_url, body)


def test_a_producers_open_transaction_on_a_key_never_holds_its_jobs_worker(
        settings: Settings) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        holder = await pool.fetchval(LIVE, "i11")
        (claim,) = await lease.claim(pool, [holder], "w", ["u"])
        assert claim is not None
        conn = await asyncpg.connect(settings.database_url)
        try:
            async with conn.transaction():  # a producer that does not commit yet
                assert await conn.fetchval(LIVE, "i11") == holder
                done = await asyncio.wait_for(
                    lease.complete(pool, [Lease.from_claim(claim, 0.0, 0.15)]), 5)
                assert done == [True]
                # the hold is free now: this open transaction takes it over
                assert await conn.fetchval(LIVE, "i11") != holder
        finally:
            await conn.close()
        # with retention, holds that ended are forgotten (live ones kept)
        await pool.fetchval(LIVE, "other")
        await _finish(pool, await pool.fetchval(LIVE, "gone"))
        await PgReaperStore(pool, Broker("", "unused")).prune_keys()
        keys = {r["key"] for r in await pool.fetch("SELECT key FROM jobq.job_unique")}
        assert keys == {"i11", "other"}, keys

    run(settings.database_url, body)


def test_bad_key_holds_get_one_line(settings: Settings, db: SyncDB,
                                    env: dict[str, str]) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        async with Client(settings) as client:
            bad: list[dict[str, Any]] = [
                {"idempotency_window_s": 5},  # no key
                {"idempotency_key": "a", "idempotency_window_s": 5,
                 "idempotency_while_live": True},
                {"idempotency_key": "a", "idempotency_window_s": -1},
                {"idempotency_key": "a", "idempotency_window_s": float("nan")},
                {"idempotency_key": "a", "on_duplicate": "ignore"},
            ]
            for options in bad:
                with pytest.raises(InvalidPayload):
                    await client.publish("u", {}, **options)
        for args in ("idempotency_window_s => 5", "idempotency_key => 'a', "
                     "idempotency_window_s => 5, idempotency_while_live => true",
                     "idempotency_key => 'a', on_duplicate => 'ignore'"):
            with pytest.raises(asyncpg.InvalidParameterValueError):
                await pool.fetchval(f"SELECT jobq.enqueue('u', '{{}}', {args})")
        assert await pool.fetchval("SELECT count(*) FROM jobq.job") == 0

    run(settings.database_url, body)
    first = run_cli(env, "publish", "u", "{}", "--idempotency-key", "c",
                    "--idempotency-while-live")
    assert first.returncode == 0, first.stderr
    one_line_error(run_cli(env, "publish", "u", "{}", "--idempotency-key", "c",
                           "--idempotency-while-live", "--on-duplicate", "refuse"), 1,
                   first.stdout.strip())
    out = run_cli(env, "publish", "u", "{}", "--idempotency-key", "c", "--idempotency-window",
                  "5", "--idempotency-while-live")
    assert out.returncode == 2 and "not allowed with" in out.stderr
