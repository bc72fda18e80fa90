"""Flow control (issue #30) on the statements themselves: a delivered id
brings a higher-priority job in its place; per-key caps and rates park what
is over and release it as slots free; pause parks everything and resume
releases it; debounce collapses a burst into one pending job; bad input is
refused in one line."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, run_cli, set_queue
from harness.helpers import with_pool as run
from jobq import lease
from jobq.client.producer import Client
from jobq.errors import InvalidPayload
from jobq.lease import Lease
from jobq.newjob import NewJob
from jobq.ops import admin
from jobq.settings import Settings
from jobq.sql import Q


async def enqueue(pool: asyncpg.Pool, queue: str, n: int = 1, **kw: Any) -> list[uuid.UUID]:
    args = ", ".join(f"{k} => ${i + 2}" for i, k in enumerate(kw))
    return [await pool.fetchval(f"SELECT jobq.enqueue($1 {', ' + args if args else ''})",
                                queue, *kw.values()) for _ in range(n)]


async def row(pool: asyncpg.Pool, jid: uuid.UUID) -> Any:
    return await pool.fetchrow("SELECT status, relay_after = 'infinity' AS parked, "
                               "published_at, lock, payload, run_at - now() AS wait "
                               "FROM jobq.job WHERE id = $1", jid)


def test_a_delivery_brings_the_best_waiting_job_and_hands_its_own_back(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        low = await enqueue(pool, "q", 3)
        (high,) = await enqueue(pool, "q", priority=5)
        (mid,) = await enqueue(pool, "q", priority=2)
        first = await lease.claim_batch(pool, low[:2], "w", ["q"])
        handed = first.handed
        got = [r for r in first.rows if r is not None]
        assert len(got) == 2
        # the two deliveries ran the priority-5 and the priority-2 jobs, best first
        assert [r.id for r in got] == [high, mid] or [r.id for r in got] == [mid, high]
        assert {r.id for r in got} == {high, mid}
        assert {h[0] for h in handed} == set(low[:2])
        for jid, _, token in handed:  # back in line, a new spell the consumer publishes
            r = await row(pool, jid)
            assert r["status"] == "queued" and r["published_at"] is None and r["lock"] == token
        # nothing better waits now: a delivery runs its own job
        again = await lease.claim_batch(pool, [low[2]], "w", ["q"])
        (own,) = again.rows
        assert own is not None and own.id == low[2] and again.handed == []

    run(db_url, body)


def test_per_key_caps_park_the_excess_and_a_finished_job_frees_its_keys_slot(
        db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        await pool.execute(Q["queue_ensure"], "t")
        await pool.execute("UPDATE jobq.queue SET max_running_per_key = 2 WHERE name = 't'")
        a = await enqueue(pool, "t", 5, key="A")
        b = await enqueue(pool, "t", 1, key="B")
        free = await enqueue(pool, "t", 2)  # unkeyed jobs are not capped
        got = await lease.claim(pool, a + b + free, "w", ["t"])
        claimed = {r.id for r in got if r is not None}
        assert len(claimed & set(a)) == 2 and set(b) <= claimed and set(free) <= claimed
        parked = [j for j in a if j not in claimed]
        assert [(await row(pool, j))["parked"] for j in parked] == [True] * len(parked)
        # A finished job of key A releases exactly one parked job of key A
        done = next(r for r in got if r is not None and r.id in set(a))
        mine = Lease.from_claim(done, 0.0, 0.15)
        assert await lease.complete(pool, [mine]) == [True]
        released = await lease.unpark_freed(pool, mine)
        assert len(released) == 1 and released[0].id in parked
        # the reapers' unpark releases nothing more: A's two slots are taken again
        # once that one is claimed
        (again,) = await lease.claim(pool, [released[0].id], "w", ["t"])
        assert again is not None
        assert (await pool.execute(Q["unpark"])) == "UPDATE 0"

    run(db_url, body)


def test_the_reapers_release_parked_keyed_jobs_per_key(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        await pool.execute(Q["queue_ensure"], "t")
        await pool.execute("UPDATE jobq.queue SET max_running_per_key = 1 WHERE name = 't'")
        jobs = {k: await enqueue(pool, "t", 3, key=k) for k in ("A", "B", "C")}
        everything = [j for js in jobs.values() for j in js]
        got = await lease.claim(pool, everything, "w", ["t"])
        assert sum(r is not None for r in got) == 3  # one per key, two parked each
        assert await pool.execute(Q["unpark"]) == "UPDATE 0"  # every key is full
        # their worker's jobs ended (completed, or cut and requeued by a reaper)
        await pool.execute("UPDATE jobq.job SET status = 'completed' WHERE status = 'active'")
        assert await pool.execute(Q["unpark"]) == "UPDATE 3"  # one per key, not six

    run(db_url, body)


def test_a_per_key_rate_spends_that_keys_tokens_only(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        await pool.execute(Q["queue_ensure"], "r")
        await pool.execute("UPDATE jobq.queue SET rate_per_s_per_key = 2 WHERE name = 'r'")
        a = await enqueue(pool, "r", 5, key="A")
        b = await enqueue(pool, "r", 2, key="B")
        got = await lease.claim(pool, a + b, "w", ["r"])
        claimed = {r.id for r in got if r is not None}
        assert len(claimed & set(a)) == 2 and set(b) <= claimed
        tokens = await pool.fetchval("SELECT tokens FROM jobq.key_rate WHERE key = 'A'")
        assert tokens < 1

    run(db_url, body)


def test_pause_parks_deliveries_and_resume_releases_them(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        running = await enqueue(pool, "p", 1)
        assert (await lease.claim(pool, running, "w", ["p"]))[0] is not None
        await admin.pause(pool, "p")
        waiting = await enqueue(pool, "p", 3)
        assert await lease.claim(pool, waiting, "w", ["p"]) == [None, None, None]
        assert [(await row(pool, j))["parked"] for j in waiting] == [True] * 3
        assert (await row(pool, running[0]))["status"] == "active"  # it runs on
        assert await pool.execute(Q["unpark"]) == "UPDATE 0"  # paused: nothing released
        assert (await admin.resume(pool, "p"))["released"] == 3
        assert [(await row(pool, j))["parked"] for j in waiting] == [False] * 3
        assert [x is not None for x in await lease.claim(pool, waiting, "w", ["p"])] == \
            [True] * 3
        with pytest.raises(Exception, match="no queue named"):
            await admin.pause(pool, "nope")

    run(db_url, body)


def test_debounce_collapses_a_burst_into_one_job_with_the_last_payload(
        settings: Settings) -> None:
    async def go() -> tuple[set[uuid.UUID], Any]:
        async with Client(settings) as client:
            ids = {await client.publish("search", {"q": q}, key="user-1", debounce_s=2)
                   for q in ("a", "ab", "abc")}
            other = await client.publish("search", {"q": "x"}, key="user-2", debounce_s=2)
            assert other not in ids
            assert client.pool is not None
            row_ = await client.pool.fetchrow(
                "SELECT payload, run_at - now() AS wait, published_at FROM jobq.job "
                "WHERE id = $1", next(iter(ids)))
        return ids, row_

    ids, r = asyncio.run(go())
    assert len(ids) == 1 and r["payload"] == '{"q": "abc"}' and r["published_at"] is None
    assert 1.5 < r["wait"].total_seconds() <= 2.0


def test_bad_flow_control_input_is_one_line(env: dict[str, str], db: SyncDB) -> None:
    for job in (NewJob("q", priority=10), NewJob("q", priority=True),
                NewJob("q", key="k" * 201), NewJob("q", key="a\x00b"),
                NewJob("q", debounce_s=1), NewJob("q", key="k", debounce_s=float("nan"))):
        with pytest.raises(InvalidPayload):
            from jobq.newjob import validate
            validate(job)
    for sql in ("SELECT jobq.enqueue('q', priority => 10)",
                "SELECT jobq.enqueue('q', key => repeat('k', 201))",
                "SELECT jobq.enqueue('q', debounce_s => 1)"):
        with pytest.raises(asyncpg.exceptions.InvalidParameterValueError):
            db.val(sql)
    with pytest.raises(asyncpg.exceptions.CheckViolationError):
        db.execute("INSERT INTO jobq.queue (name, rate_per_s_per_key) VALUES ('x', 'NaN')")
    for args in (["publish", "q", "{}", "--priority", "12"],
                 ["queue", "set", "q", "--max-running-per-key", "-1"],
                 ["queue", "set", "q", "--rate-per-second-per-key", "nan"],
                 ["queue", "pause", "never-made"]):
        out = run_cli(env, *args)
        assert out.returncode in (1, 2) and len(out.stderr.strip().splitlines()) == 1, \
            (args, out.stderr)
    set_queue(db, "q")
    assert db.val("SELECT count(*) FROM jobq.job") == 0


def test_a_keys_burst_is_parked_at_the_door_and_gets_no_messages(
        settings: Settings, db: SyncDB) -> None:
    """Schema 0015: past its cap, a key's new due jobs are parked as they are
    inserted, and the producer publishes none of them."""
    set_queue(db, "door", max_running_per_key=3)

    async def go() -> tuple[list[Any], list[Any]]:
        async with Client(settings) as client:
            a = await client.publish_many([NewJob("door", {}, key="A") for _ in range(50)])
            b = [await client.publish("door", {}, key="B") for _ in range(2)]
            return a, b

    a, b = asyncio.run(go())
    held = db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND relay_after = "
                  "'infinity'", a)
    assert held == 47 and db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                                 "relay_after = 'infinity'", b) == 0
    # the 47 are not in the broker: only the 3 in line and B's 2 were published
    from tests.integration.test_publish import broker_ids

    out = asyncio.run(broker_ids(settings, "door"))
    assert len(out) == 5 and set(map(str, b)) <= set(out)


def test_the_reapers_release_a_limits_room_once_best_first(db_url: str) -> None:
    """Issue #47: each sweep released another cap's worth of parked jobs while
    the last ones still waited unclaimed in the broker; issue #51: parked
    jobs came back oldest first, a priority-9 job last of all."""
    async def body(pool: asyncpg.Pool) -> None:
        await pool.execute(Q["queue_ensure"], "m")
        await pool.execute("UPDATE jobq.queue SET max_running = 2 WHERE name = 'm'")
        low = await enqueue(pool, "m", 6)
        (high,) = await enqueue(pool, "m", 1, priority=9)
        await pool.execute("UPDATE jobq.job SET relay_after = 'infinity', "
                           "published_at = NULL WHERE queue = 'm'")  # all parked
        assert await pool.execute(Q["unpark"]) == "UPDATE 2"
        released = {r["id"] for r in await pool.fetch(
            "SELECT id FROM jobq.job WHERE queue = 'm' AND relay_after < 'infinity'")}
        assert high in released and len(released & set(low)) == 1
        assert await pool.execute(Q["unpark"]) == "UPDATE 0"  # those two are not started yet

    run(db_url, body)
