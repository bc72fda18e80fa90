"""The lease layer on a real database: every fenced write, the reaper's
requeue and the publish marks, without processes in the way."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg

from harness.helpers import with_pool as run  # used by the tests below

__all__ = ["claim", "new_job", "run", "status"]
from jobq import lease, rows
from jobq.amqp.broker import Broker
from jobq.lease import Failure, Lease
from jobq.reaper.store import PgReaperStore
from jobq.sql import Q


async def new_job(pool: asyncpg.Pool, queue: str = "q", **queue_settings: Any) -> uuid.UUID:
    await pool.execute(Q["queue_ensure"], queue)
    for col, val in queue_settings.items():
        await pool.execute(f"UPDATE jobq.queue SET {col} = $2 WHERE name = $1", queue, val)
    job_id: uuid.UUID = await pool.fetchval("SELECT jobq.enqueue($1, '{}')", queue)
    return job_id


async def claim(pool: asyncpg.Pool, job_id: uuid.UUID, worker: str = "w1") -> Lease | None:
    (row,) = await lease.claim(pool, [job_id], worker, ["q"])
    return None if row is None else Lease.from_claim(row, 0.0, 0.15)


async def lapse(pool: asyncpg.Pool, job_id: uuid.UUID) -> None:
    await pool.execute("UPDATE jobq.job SET lease_expires_at = now() - interval '1 ms' "
                       "WHERE id = $1", job_id)


async def status(pool: asyncpg.Pool, job_id: uuid.UUID) -> Any:
    return await pool.fetchrow("SELECT * FROM jobq.job WHERE id = $1", job_id)


def test_claim_is_exclusive_even_within_one_batch(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool)
        rows = await lease.claim(pool, [jid, jid], "w1", ["q"])
        assert rows[0] is not None and rows[1] is None
        assert await claim(pool, jid, "w2") is None
        row = await status(pool, jid)
        assert row["status"] == "active" and row["worker_id"] == "w1" and row["attempts"] == 1
        # The deadline comes from the database clock and the queue's lease.
        left = await pool.fetchval("SELECT extract(epoch FROM lease_expires_at - now()) "
                                   "FROM jobq.job WHERE id = $1", jid)
        assert 29 < left <= 30

    run(db_url, body)


def test_claim_skips_jobs_not_due_and_foreign_queues(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        later = await pool.fetchval("SELECT jobq.enqueue('q', '{}', 60)")
        other = await pool.fetchval("SELECT jobq.enqueue('elsewhere', '{}')")
        assert await lease.claim(pool, [later, other], "w", ["q"]) == [None, None]
        misses = await lease.claim_misses(pool, [later, other, uuid.uuid4()])
        assert misses[later].not_due and misses[other].queue == "elsewhere"

    run(db_url, body)


def test_fenced_writes_need_the_token_and_a_live_lease(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool)
        mine = await claim(pool, jid)
        assert mine is not None
        forged = Lease(jid, "q", uuid.uuid4(), 30, 0.15, 0.0)
        assert await lease.renew(pool, [forged], "w1") == rows.Renewal(frozenset())
        assert await lease.complete(pool, [forged]) == [False]
        assert await lease.fail(pool, [Failure(forged, "x", True)]) == [None]
        assert await lease.release(pool, [forged]) == []
        assert (await lease.renew(pool, [mine], "w1")).renewed == {jid}
        await lapse(pool, jid)
        # Lapsed, even if no reaper came yet: the lease is gone for good.
        assert await lease.renew(pool, [mine], "w1") == rows.Renewal(frozenset())
        assert await lease.complete(pool, [mine]) == [False]
        assert (await status(pool, jid))["status"] == "active"

    run(db_url, body)


def test_a_renewal_never_waits_for_a_row_another_transaction_holds(db_url: str) -> None:
    """I11: a row held by another session (here a plain open transaction)
    comes back busy at once; the worker's other leases are renewed."""
    async def body(pool: asyncpg.Pool) -> None:
        held, free = await new_job(pool), await new_job(pool)
        a, b = await claim(pool, held), await claim(pool, free)
        assert a is not None and b is not None
        async with pool.acquire() as other, other.transaction():
            await other.execute("SELECT 1 FROM jobq.job WHERE id = $1 FOR NO KEY UPDATE", held)
            got = await asyncio.wait_for(lease.renew(pool, [a, b], "w1"), 5)
        assert got == rows.Renewal(frozenset({free}), frozenset({held}))
        assert (await lease.renew(pool, [a, b], "w1")).renewed == {held, free}

    run(db_url, body)


def test_retried_completion_recognises_itself(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool)
        mine = await claim(pool, jid)
        assert mine is not None
        assert await lease.complete(pool, [mine]) == [True]
        assert await lease.complete(pool, [mine]) == [True]  # reply lost, sent again
        other = Lease(jid, "q", uuid.uuid4(), 30, 0.15, 0.0)
        assert await lease.complete(pool, [other]) == [False]
        row = await status(pool, jid)
        assert row["status"] == "completed" and row["lock"] == mine.lock

    run(db_url, body)


def test_fail_retries_with_backoff_then_fails(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool, max_attempts=2, backoff_base_s=10)
        first = await claim(pool, jid)
        assert first is not None
        (row,) = await lease.fail(pool, [Failure(first, "ValueError: bad", True)])
        assert row is not None and row.retry_in_s is not None
        assert row.status == "queued" and 9 < row.retry_in_s <= 10
        j = await status(pool, jid)
        assert j["errors"] == 1 and j["published_at"] is None
        assert j["last_error"] == "ValueError: bad"
        assert await claim(pool, jid) is None  # not due yet
        await pool.execute("UPDATE jobq.job SET run_at = now() WHERE id = $1", jid)
        second = await claim(pool, jid)
        assert second is not None and second.lock != first.lock
        (row,) = await lease.fail(pool, [Failure(second, "ValueError: still bad", True)])
        assert row is not None and row.status == "failed"
        j = await status(pool, jid)
        assert j["errors"] == 2 and j["attempts"] == 2 and j["finished_at"] is not None

    run(db_url, body)


def test_release_requeues_at_once_without_counting(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool)
        mine = await claim(pool, jid)
        assert mine is not None
        (row,) = await lease.release(pool, [mine])
        assert row.id == jid
        j = await status(pool, jid)
        assert (j["status"], j["stalls"], j["errors"], j["published_at"]) == ("queued", 0, 0, None)
        assert await claim(pool, jid) is not None

    run(db_url, body)


def test_concurrent_reapers_requeue_each_lapsed_lease_once(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        ids = [await new_job(pool) for _ in range(200)]
        for jid in ids:
            assert await claim(pool, jid) is not None
        await pool.execute("UPDATE jobq.job SET lease_expires_at = now() - interval '1 s'")

        async def reaper() -> list[Any]:
            got = []
            while rows := await lease.requeue_lapsed(pool, 7, "r"):
                got += rows
            return got

        results = await asyncio.gather(reaper(), reaper(), reaper())
        requeued = [r.id for rs in results for r in rs]
        assert sorted(requeued) == sorted(ids)  # every one, exactly once
        # one worker held all 200: each witnessed one crash, none is charged,
        # none is a suspect yet (that takes a second crash)
        row = await pool.fetchrow("SELECT min(suspect_stalls) AS lo, max(suspect_stalls) AS hi,"
                                  " max(stalls) AS stalls, bool_or(suspect) AS s FROM jobq.job")
        assert row is not None
        assert (row["lo"], row["hi"], row["stalls"], row["s"]) == (1, 1, 0, False)

    run(db_url, body)


def test_job_of_death_and_stall_cooldown(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool, max_stalls=1, stall_cooldown_s=30)
        await claim(pool, jid)
        await lapse(pool, jid)
        (r,) = await lease.requeue_lapsed(pool, 10, "r")
        j = await status(pool, jid)
        assert r.status == "queued" and j["run_at"] <= await pool.fetchval("SELECT now()")
        await claim(pool, jid)
        await lapse(pool, jid)
        (r,) = await lease.requeue_lapsed(pool, 10, "r")
        j = await status(pool, jid)
        assert r.status == "failed" and j["stalls"] == 2
        assert "job of death" in j["last_error"] and "max_stalls=1" in j["last_error"]

    run(db_url, body)


def test_stall_cooldown_grows_after_the_first_stall(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool, max_stalls=5, stall_cooldown_s=30)
        delays = []
        for _ in range(3):
            await pool.execute("UPDATE jobq.job SET run_at = now() WHERE id = $1", jid)
            assert await claim(pool, jid) is not None
            await lapse(pool, jid)
            await lease.requeue_lapsed(pool, 10, "r")
            delays.append(await pool.fetchval(
                "SELECT round(extract(epoch FROM run_at - now())) FROM jobq.job WHERE id = $1",
                jid))
        assert [float(d) for d in delays] == [0.0, 30.0, 60.0]

    run(db_url, body)


def test_publish_mark_only_hits_the_spell_it_published(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool)
        mine = await claim(pool, jid)
        assert mine is not None
        await lease.fail(pool, [Failure(mine, "x", True, 0.0)])  # queued again, new spell
        # A late mark for the first spell (lock NULL) must not mark this one.
        await pool.execute(Q["mark_published"], [jid], [None])
        assert (await status(pool, jid))["published_at"] is None
        await pool.execute(Q["mark_published"], [jid], [mine.lock])
        assert (await status(pool, jid))["published_at"] is not None

    run(db_url, body)


def test_reapers_prune_finished_jobs_by_their_queues_retention(db_url: str) -> None:
    from jobq.reaper import Reaper
    from jobq.settings import Settings

    async def body(pool: asyncpg.Pool) -> None:
        old_done, new_done, old_failed = [await new_job(pool, keep_completed_s=60)
                                          for _ in range(3)]
        for jid in (old_done, new_done, old_failed):  # each leaves a 'claimed' event
            assert await claim(pool, jid) is not None
        await pool.execute(
            "UPDATE jobq.job SET status = CASE WHEN id = $3 THEN 'failed' ELSE 'completed' END,"
            " finished_at = now() - CASE WHEN id = $2 THEN interval '10 s' "
            "ELSE interval '2 min' END WHERE id = ANY(ARRAY[$1, $2, $3]::uuid[])",
            old_done, new_done, old_failed)
        reaper = Reaper(Settings(database_url=db_url), PgReaperStore(pool, Broker("", "unused")))
        assert await reaper.prune_expired() == 1
        left = {r["id"] for r in await pool.fetch("SELECT id FROM jobq.job")}
        assert left == {new_done, old_failed}  # failed are kept 7 days by default
        events = await pool.fetch("SELECT job_id, count(*) FROM jobq.job_event "
                                  "GROUP BY job_id")
        assert {r["job_id"]: r["count"] for r in events} == {new_done: 1, old_failed: 1}

    run(db_url, body)


def test_a_retried_failure_whose_reply_was_lost_recognises_itself(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool)
        mine = await claim(pool, jid)
        assert mine is not None
        (first,) = await lease.fail(pool, [Failure(mine, "boom", True, 30.0)])
        assert first is not None and first.retry_in_s is not None
        assert first.status == "queued" and first.retry_in_s > 0
        # The same write again (its first reply lost): ours, not a lost lease.
        (again,) = await lease.fail(pool, [Failure(mine, "boom", True, 30.0)])
        assert again is not None and again.status == "queued"
        # Another claim's token (a fresh lock) never matches it.
        other = Lease(mine.job_id, mine.queue, uuid.uuid4(), 30.0, 0.15, 0.0)
        assert (await lease.fail(pool, [Failure(other, "boom", True, 0.0)])) == [None]
        assert (await status(pool, jid))["errors"] == 1  # recorded once

    run(db_url, body)


def test_a_retried_claim_recognises_the_rows_its_lost_reply_claimed(db_url: str) -> None:
    """The first attempt committed, its reply was lost: the retry with the
    same tokens gets those rows back as its own; anyone else does not."""
    async def body(pool: asyncpg.Pool) -> None:
        a, b = await new_job(pool), await new_job(pool)
        tokens = [uuid.uuid4(), uuid.uuid4()]
        first = await lease.claim(pool, [a, b], "w1", ["q"], tokens)  # reply "lost"
        assert all(r is not None for r in first)
        assert await lease.claim(pool, [a, b], "w1", ["q"], tokens) == [None, None]
        again = [r for r in await lease.claim(pool, [a, b], "w1", ["q"], tokens, retried=True)
                 if r is not None]
        assert [r.lock for r in again] == tokens and [r.id for r in again] == [a, b]
        assert again[0].lease_s == first[0].lease_s  # type: ignore[union-attr]  # the row, whole
        # Another worker, or other tokens, never recover them.
        assert await lease.claim(pool, [a, b], "w2", ["q"], tokens, retried=True) == [None, None]
        assert await lease.claim(pool, [a], "w1", ["q"], [uuid.uuid4()], retried=True) == [None]
        assert (await status(pool, a))["attempts"] == 1  # claimed once

    run(db_url, body)
