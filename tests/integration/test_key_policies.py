"""Key policies (issue #51, item 1; schema 0027): what a keyed job meets when
its key already has work. fifo: one at a time in publish order, a retrying
head before its successors; latest: a newer job cancels the pending ones and
stops the running one at its next renewal; singleton: a publish while the key
has a live job returns that job's id, whoever races. Real consumer and
reaper; order and overlap read from test_run by the database clock."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import asyncpg

from harness.helpers import SyncDB, set_queue, with_pool
from jobq.amqp.broker import Broker
from jobq.newjob import NewJob
from jobq.reaper.store import PgReaperStore
from jobq.rows import Superseded
from jobq.settings import Settings
from jobq.sql import Q
from tests.integration.test_consumer import World, _app_db, scenario  # noqa: F401


async def _runs(w: World, ids: list[uuid.UUID]) -> list[Any]:
    """Every run of these jobs, by start."""
    return await w.pool.fetch(
        "SELECT job_id, attempt, started_at, ended_at, outcome FROM test_run "
        "WHERE job_id = ANY($1) ORDER BY started_at", ids)


def test_fifo_runs_a_key_in_publish_order_one_at_a_time_a_retrying_head_first(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        # The head fails once and retries after its backoff (0.4 s); its
        # successors, published in the same call, wait for it to end.
        jobs = [NewJob("work", {"sleep": 0.05, "fail_times": 1 if i == 0 else 0}, key="k")
                for i in range(5)]
        jobs.append(NewJob("work", {"sleep": 0.05}, key="other"))
        ids = await w.client.publish_many(jobs)
        for jid in ids:
            await w.wait_status(jid, "completed")
        runs = await _runs(w, ids[:5])
        assert [r["job_id"] for r in runs] == [ids[0], *ids[:5]], runs  # the head twice, first
        # a failed run records no end (harness/apps.py): its 'retry' event is it
        failed_at = await w.pool.fetchval(
            "SELECT at FROM jobq.job_event WHERE job_id = $1 AND event = 'retry'", ids[0])
        for a, b in itertools.pairwise(runs):
            assert (a["ended_at"] or failed_at) <= b["started_at"], f"runs overlapped: {a} {b}"
        other = (await _runs(w, ids[5:]))[0]
        assert other["started_at"] < runs[1]["started_at"], "another key waited for this one"

    scenario(settings, body, max_attempts=3, backoff_base_s=0.4, key_policy="fifo")


def test_fifo_halting_on_failure_stops_the_key_until_its_failed_job_is_retried(
        settings: Settings) -> None:
    """#51.1's option: with halt_on_failure a key's failed job stops the key
    (its successors stay parked, other keys go on) until jobq retry of that
    job, which then runs first and the rest after it, in order. Without it
    (the test above's queue) the next job starts once the head failed."""
    from jobq.ops import admin

    async def body(w: World) -> None:
        jobs = [NewJob("work", {"sleep": 0.05, "fail_times": 1 if i == 0 else 0}, key="k")
                for i in range(3)]
        ids = await w.client.publish_many(jobs)
        (other,) = await w.client.publish_many([NewJob("work", {"sleep": 0.05}, key="o")])
        await w.wait_status(ids[0], "failed")
        await w.wait_status(other, "completed")  # another key goes on
        await asyncio.sleep(1.0)  # what would have started by now (jobs of 0.05 s)
        assert await _runs(w, ids[1:]) == [], "a successor started after a failed head"
        assert [r["parked"] for r in await w.pool.fetch(
            "SELECT relay_after = 'infinity' AS parked FROM jobq.job WHERE id = ANY($1)",
            ids[1:])] == [True, True]
        await admin.retry(w.pool, ids[0])  # the reaper's relay publishes it
        for jid in ids:
            await w.wait_status(jid, "completed")
        runs = await _runs(w, ids)
        assert [r["job_id"] for r in runs] == [ids[0], *ids], runs  # failed, retried, then 1, 2

    scenario(settings, body, max_attempts=1, key_policy="fifo", halt_on_failure=True)


def test_latest_cancels_the_pending_and_stops_the_running_job_of_its_key(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        (old,) = await w.client.publish_many([NewJob("work", {"sleep": 30}, key="k")])
        await w.wait_status(old, "active")
        a, b, new = await w.client.publish_many(
            [NewJob("work", {"n": i}, key="k") for i in range(3)])
        row = await w.wait_status(old, "cancelled")  # at its next renewal (lease 1 s)
        assert row["last_error"] == f"superseded by job {new} (key policy latest)", dict(row)
        for jid in (a, b):
            row = await w.wait_status(jid, "cancelled")
            assert f"superseded by job {new}" in row["last_error"], dict(row)
        await w.wait_status(new, "completed")
        runs = await _runs(w, [old, a, b, new])
        assert [r["job_id"] for r in runs] == [old, new], runs  # pending ones never ran
        for _ in range(250):  # the stopped handler's own end
            if (await _runs(w, [old]))[0]["outcome"] == "cancelled":
                break
            await asyncio.sleep(0.02)
        assert (await _runs(w, [old]))[0]["outcome"] == "cancelled"
        events = [r["event"] for r in await w.pool.fetch(
            "SELECT event FROM jobq.job_event WHERE job_id = $1", old)]
        assert "superseded" in events, events
        # a late write of the stopped run is refused by the fence
        assert (await w.row(old))["status"] == "cancelled"

    scenario(settings, body, key_policy="latest")


def test_a_newer_latest_job_cancels_a_delayed_older_one_within_a_sweep(
        settings: Settings) -> None:
    """#51.1: an older job of the key that is delayed (or parked) was
    cancelled only when it came to start, 60 s later here; the reapers'
    supersede duty (schema 0042) does it within a sweep. Another key's
    delayed job is untouched."""
    async def body(w: World) -> None:
        old, mine = await w.client.publish_many(
            [NewJob("work", {"n": 0}, key="k", delay_s=60),
             NewJob("work", {"n": 0}, key="other", delay_s=60)])
        (new,) = await w.client.publish_many([NewJob("work", {"n": 1}, key="k")])
        row = await w.wait_status(old, "cancelled", timeout=5)
        assert row["last_error"] == f"superseded by job {new} (key policy latest)", dict(row)
        assert (await w.row(mine))["status"] == "queued"
        await w.wait_status(new, "completed")
        assert [r["job_id"] for r in await _runs(w, [old, new])] == [new]
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.latest_key") == 0

    scenario(settings, body, key_policy="latest")


def test_a_latest_completion_landing_after_a_newer_publish_is_refused(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        # The completion statement itself, on a queue no consumer reads: a run
        # that ends between the newer publish and its next renewal.
        await w.pool.execute("INSERT INTO jobq.queue (name, key_policy) VALUES ('quiet', "
                             "'latest')")
        old = await w.pool.fetchval("SELECT jobq.enqueue('quiet', key => 'k')")
        token = uuid.uuid4()
        await w.pool.execute("UPDATE jobq.job SET status = 'active', lock = $2, attempts = 1, "
                             "lease_expires_at = now() + interval '1 minute' WHERE id = $1",
                             old, token)
        new = await w.pool.fetchval("SELECT jobq.enqueue('quiet', key => 'k')")
        done = await w.pool.fetch(Q["complete"], [old], [token], ['"late"'])
        assert done == []  # not completed: the worker takes it as lost
        row = await w.row(old)
        assert row["status"] == "cancelled" and row["result"] is None, dict(row)
        assert row["last_error"] == f"superseded by job {new} (key policy latest)"

    scenario(settings, body)


def test_singleton_returns_the_live_job_of_the_key_even_to_racing_producers(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        (first,) = await w.client.publish_many([NewJob("work", {"sleep": 0.5}, key="k")])
        again = await w.client.publish_many([NewJob("work", {}, key="k"),
                                             NewJob("work", {}, key="k2")])
        assert again[0] == first and again[1] != first
        await w.wait_status(first, "completed")
        (after,) = await w.client.publish_many([NewJob("work", {}, key="k")])
        assert after != first, "a key whose job ended takes a new one"
        await w.wait_status(after, "completed")

        # Three producers, each in its own open transaction, race on one key.
        conns = [await asyncpg.connect(w.settings.database_url) for _ in range(3)]
        try:
            txs = [c.transaction() for c in conns]
            for t in txs:
                await t.start()

            async def publish(c: asyncpg.Connection) -> Any:
                return await c.fetchval(
                    "SELECT jobq.enqueue('work', '{\"sleep\": 0.5}', key => 'race')")

            tasks = [asyncio.create_task(publish(c)) for c in conns]
            # Whichever inserted first holds the others (they wait on its
            # row in job_singleton_idx) until it commits.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            first_in = tasks.index(next(iter(done)))
            await txs[first_in].commit()
            got = [await t for t in tasks]
            for i, t in enumerate(txs):
                if i != first_in:
                    await t.commit()
        finally:
            for c in conns:
                await c.close()
        assert len(set(got)) == 1, got
        assert await w.pool.fetchval(
            "SELECT count(*) FROM jobq.job WHERE queue = 'work' AND key = 'race'") == 1

    scenario(settings, body, key_policy="singleton")


def test_a_bad_key_policy_is_refused_and_debounce_does_not_mix(settings: Settings) -> None:
    async def body(w: World) -> None:
        try:
            await w.pool.execute("UPDATE jobq.queue SET key_policy = 'newest' WHERE name = 'x'")
            await w.pool.execute("INSERT INTO jobq.queue (name, key_policy) VALUES ('x', 'newest')")
        except asyncpg.CheckViolationError:
            pass
        else:
            raise AssertionError("key_policy 'newest' was accepted")
        try:
            await w.pool.fetchval("SELECT jobq.enqueue('work', key => 'k', debounce_s => 1)")
        except asyncpg.PostgresError as exc:
            assert "key policy fifo" in str(exc), exc
        else:
            raise AssertionError("debounce was accepted in a fifo queue")

    scenario(settings, body, key_policy="fifo")


def test_a_fifo_keys_next_job_costs_the_same_whatever_its_finished_history(
        db_url: str) -> None:
    """Flat work (#49's rule, #51's fifo): the claim's "an earlier job of the
    key not ended" and the release of the key's next job walked every job of
    the key still kept, finished ones included (1,510 buffers a job at
    10,000 finished, bench/fifo_depth.py). Buffers per job of a key with 20x
    the finished history must stay within 1.5x (both read the head: ~200)."""
    async def per_job(conn: asyncpg.Connection, key: str, history: int) -> float:
        await conn.execute("SELECT count(*) FROM (SELECT jobq.enqueue('deep', '{}', key => $1, "
                           "relay_grace_s => 60) FROM generate_series(1, $2)) s",
                           key, history + 30)
        first = await conn.fetchval("SELECT min(seq) FROM jobq.job WHERE key = $1", key)
        await conn.execute("UPDATE jobq.job SET status = 'completed', finished_at = now() "
                           "WHERE key = $1 AND seq < $2", key, first + history)
        await conn.execute("UPDATE jobq.job SET relay_after = 'infinity', published_at = NULL "
                           "WHERE key = $1 AND status = 'queued' AND seq > $2", key,
                           first + history)
        await conn.execute("VACUUM ANALYZE jobq.job")
        head = await conn.fetchval("SELECT id FROM jobq.job WHERE key = $1 AND status = "
                                   "'queued' AND relay_after < 'infinity'", key)
        blocks = "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = " \
                 "current_database()"
        await asyncio.sleep(1.2)  # an idle backend's counters are flushed after ~1 s
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        before = await conn.fetchval(blocks)
        for _ in range(20):
            (row,) = await conn.fetch(Q["claim"], [head], "t", ["deep"], [uuid.uuid4()])
            assert row["id"] == head and not row["handed"]
            await conn.fetch(Q["complete"], [head], [row["lock"]], [None])
            (nxt,) = await conn.fetch(Q["unpark_freed"], head, row["lock"], None)
            head = nxt["id"]
        await asyncio.sleep(1.2)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        return float(await conn.fetchval(blocks) - before) / 20

    async def go() -> tuple[float, float]:
        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute("INSERT INTO jobq.queue (name, key_policy) VALUES ('deep', 'fifo')")
            return await per_job(conn, "short", 200), await per_job(conn, "long", 4000)
        finally:
            await conn.close()

    short, long = asyncio.run(go())
    print(f"fifo: {short:.0f} buffers a job after 200 finished, {long:.0f} after 4,000")
    assert long < 1.5 * short, (short, long)


def test_a_latest_job_committed_while_a_sweep_runs_is_still_seen_by_the_next(
        settings: Settings, db: SyncDB) -> None:
    """CI saw a delayed older job stay queued past the sweeps: its key's note
    was one row per key, and a newer job committing while a sweep ran left no
    note of its own (the row was there already), so the sweep took the row,
    could not see the newer job yet, and no later sweep looked again. A
    producer still in its transaction when the sweep runs is the same race,
    made to happen in order here."""
    set_queue(db, "lk", key_policy="latest")

    async def body(pool: asyncpg.Pool) -> None:
        store = PgReaperStore(pool, Broker("", "unused"))
        old = await pool.fetchval("SELECT jobq.enqueue('lk', key => 'k', delay_s => 60)")
        async with pool.acquire() as producer, producer.transaction():
            new = await producer.fetchval("SELECT jobq.enqueue('lk', key => 'k')")
            assert (await store.supersede_pending(100)).cancelled == 0  # not seen yet
        assert (await store.supersede_pending(100)).cancelled == 1  # once it is committed
        row = await pool.fetchrow("SELECT status, last_error FROM jobq.job WHERE id = $1", old)
        assert row is not None and row["status"] == "cancelled", dict(row or {})
        assert row["last_error"] == f"superseded by job {new} (key policy latest)"
        assert await pool.fetchval("SELECT count(*) FROM jobq.latest_key") == 0
        assert await store.supersede_pending(100) == Superseded(0, False)
        # A sweep that took its limit of notes says more may wait, though it
        # cancelled nothing (new keys): the reaper sweeps again at once rather
        # than leave the rest for its next interval.
        for k in ("a", "b", "c"):
            await pool.fetchval("SELECT jobq.enqueue('lk', key => $1)", k)
        assert await store.supersede_pending(2) == Superseded(0, True)
        assert await store.supersede_pending(2) == Superseded(0, False)
        assert await pool.fetchval("SELECT count(*) FROM jobq.latest_key") == 0

    with_pool(settings.database_url, body)
