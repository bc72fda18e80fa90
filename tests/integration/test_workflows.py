"""Workflows (issue #31) on the statements themselves: a job that waits for
others is released by the last one's completion, exactly once even when
they complete at the same moment; a failure cancels what waits, with the
reason, down the chain; bad parents are refused; a durable step runs once
per job and a zombie cannot record one; a workflow is one transaction and
can be inspected and cancelled."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, run_cli, with_pool
from jobq import lease
from jobq.client.producer import Client
from jobq.client.workflow import Workflow
from jobq.errors import BadInput, LeaseLost, StepRefused
from jobq.lease import Lease
from jobq.newjob import NewJob
from jobq.settings import Settings
from jobq.worker.steps import JobLink


def enqueue(db: SyncDB, queue: str = "q", after: list[Any] | None = None) -> Any:
    return db.val("SELECT jobq.enqueue($1, after => $2::uuid[])", queue, after)


def row(db: SyncDB, jid: Any) -> Any:
    return db.fetchrow("SELECT status, waiting_on, relay_after = 'infinity' AS held, "
                       "last_error FROM jobq.job WHERE id = $1", jid)


def end(db: SyncDB, jid: Any, status: str) -> None:
    """The job ends, and a reaper's settler sees it (reaper/dependants.py)."""
    db.execute("UPDATE jobq.job SET status = $2, finished_at = now() WHERE id = $1", jid, status)
    settle(db)


def settle(db: SyncDB) -> Any:
    """What one sweep of the reapers' dependants duty does."""
    return db.fetchrow("SELECT * FROM jobq.settle_dependants(1000)")


def test_a_chain_runs_in_order_and_a_failure_cancels_what_waits(db: SyncDB) -> None:
    a = enqueue(db)
    b = enqueue(db, after=[a])
    c = enqueue(db, after=[b])
    assert (row(db, b)["waiting_on"], row(db, b)["held"]) == (1, True)
    # not claimable while it waits, whatever delivers its id
    assert db.val("SELECT count(*) FROM jobq.q_claim($1, 'w', '{q}', $2)", [b],
                  [uuid.uuid4()]) == 0
    end(db, a, "completed")
    assert (row(db, b)["waiting_on"], row(db, b)["held"]) == (0, False)
    assert row(db, c)["waiting_on"] == 1
    end(db, b, "failed")
    r = row(db, c)
    assert r["status"] == "cancelled" and f"job {b} it waits for was failed" in r["last_error"]


def test_a_fan_in_is_released_once_when_its_parents_end_at_the_same_moment(
        db: SyncDB) -> None:
    parents = [enqueue(db) for _ in range(20)]
    callback = enqueue(db, "cb", after=parents)
    assert row(db, callback)["waiting_on"] == 20

    async def go() -> None:
        conns = [await asyncpg.connect(db.url) for _ in range(4)]
        try:
            async def complete(conn: asyncpg.Connection, ids: list[Any]) -> None:
                for i in ids:
                    await conn.execute("UPDATE jobq.job SET status = 'completed', "
                                       "finished_at = now() WHERE id = $1", i)

            await asyncio.gather(*(complete(c, parents[k::4]) for k, c in enumerate(conns)))
        finally:
            for c in conns:
                await c.close()

    asyncio.run(go())
    assert row(db, callback)["waiting_on"] == 20  # the ends only woke the reapers
    assert settle(db)["released"] == 1
    r = row(db, callback)
    assert (r["status"], r["waiting_on"], r["held"]) == ("queued", 0, False)
    assert settle(db)["released"] == 0  # once


def test_parents_are_checked_at_publish(db: SyncDB) -> None:
    with pytest.raises(asyncpg.exceptions.ForeignKeyViolationError, match="do not exist"):
        enqueue(db, after=[uuid.uuid4()])
    with pytest.raises(asyncpg.exceptions.InvalidParameterValueError, match="at most 1000"):
        enqueue(db, after=[uuid.uuid4() for _ in range(1001)])
    done, failed = enqueue(db), enqueue(db)
    end(db, done, "completed")
    end(db, failed, "failed")
    ready = enqueue(db, after=[done])
    assert (row(db, ready)["waiting_on"], row(db, ready)["held"]) == (0, False)
    doomed = enqueue(db, after=[done, failed])
    assert row(db, doomed)["status"] == "cancelled"
    assert db.val("SELECT count(*) FROM jobq.job") == 4  # nothing else was written
    from jobq.newjob import validate

    with pytest.raises(Exception, match="at most 1000"):
        validate(NewJob("q", after=[uuid.uuid4() for _ in range(1001)]))


calls: list[str] = []


def charge(amount: int) -> dict[str, int]:
    calls.append("charge")
    return {"charged": amount}


def other() -> int:
    return 1


def test_a_step_runs_once_per_job_and_a_zombie_cannot_record_one(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await pool.fetchval("SELECT jobq.enqueue('q')")
        (first,) = await lease.claim(pool, [jid], "w1", ["q"])
        assert first is not None
        run1 = JobLink(pool, jid, first.lock, 65536)
        assert await run1.step("charge", charge, 5) == {"charged": 5}
        assert calls == ["charge"]
        # the run dies; the job is claimed again with a new token
        await pool.execute("UPDATE jobq.job SET status = 'queued', lease_expires_at = NULL "
                           "WHERE id = $1", jid)
        (second,) = await lease.claim(pool, [jid], "w2", ["q"])
        assert second is not None
        run2 = JobLink(pool, jid, second.lock, 65536)
        assert await run2.step("charge", charge, 5) == {"charged": 5}
        assert calls == ["charge"]  # not called again
        with pytest.raises(StepRefused, match="recorded by"):  # fails the job at once
            await run2.step("charge", other)
        with pytest.raises(StepRefused, match="not JSON"):
            await run2.step("bad", lambda: {1, 2})
        assert await pool.fetchval("SELECT count(*) FROM jobq.job_step WHERE name = 'bad'") == 0
        # the first run, a zombie now, can neither record nor read
        with pytest.raises(LeaseLost):
            await run1.step("late", other)
        # nor can the holder once its lease lapsed
        await pool.execute("UPDATE jobq.job SET lease_expires_at = now() - interval '1 s'")
        with pytest.raises(LeaseLost):
            await run2.step("late", other)
        assert Lease is not None

    calls.clear()
    with_pool(db_url, body)


def test_a_workflow_is_one_transaction_inspected_and_cancelled(
        settings: Settings, db: SyncDB, env: dict[str, str]) -> None:
    wf = Workflow()
    resize = wf.step("resize", {"img": 7})
    upload = wf.step("upload", {"img": 7}, after=[resize])
    wf.step("notify", {"img": 7}, after=[upload])

    async def go() -> Any:
        async with Client(settings) as client:
            return await client.publish_workflow(wf)

    wid = asyncio.run(go())
    rows = db.fetch("SELECT id, queue, waiting_on FROM jobq.job WHERE workflow_id = $1 "
                    "ORDER BY created_at, id", wid)
    assert {r["queue"]: r["waiting_on"] for r in rows} == {"resize": 0, "upload": 1,
                                                          "notify": 1}
    assert upload.id in {r["id"] for r in rows}
    out = run_cli(env, "inspect", str(wid))
    assert out.returncode == 0 and "3 step(s)" in out.stdout, out.stderr
    out = run_cli(env, "inspect", str(upload.id))
    assert "waits for" in out.stdout and "waited for by" in out.stdout
    out = run_cli(env, "cancel", str(wid))
    assert out.returncode == 0 and "3 step(s)" in out.stdout, out.stderr
    assert {r["status"] for r in db.fetch("SELECT status FROM jobq.job WHERE workflow_id = $1",
                                          wid)} == {"cancelled"}
    with pytest.raises(BadInput, match="declared before"):
        Workflow().step("x", after=[resize])


def test_a_job_whose_parents_already_completed_is_relayed_at_once(
        settings: Settings, db: SyncDB) -> None:
    """Found by hand: `jobq publish work '{}' --after P` with P completed a
    second earlier started 6 s later. The client never publishes a job that
    waits (its parents' end releases it), so such a job was left to the
    relay's grace (5 s by default): it must be handed to the relay at once,
    with the NOTIFY that wakes a reaper, as a released dependant is."""
    parent = enqueue(db)
    end(db, parent, "completed")
    pending = enqueue(db)
    slow = settings.model_copy(update={"producer": settings.producer.model_copy(
        update={"relay_grace_s": 60.0})})

    async def go() -> tuple[list[Any], list[str]]:
        heard: list[str] = []
        listener = await asyncpg.connect(db.url)
        await listener.add_listener("jobq_relay", lambda *a: heard.append(a[3]))
        try:
            async with Client(slow) as client:
                ids = [await client.publish("ready", {}, after=[parent]),
                       *await client.publish_many([NewJob("waits", {}, after=[pending])])]
            await listener.execute("SELECT 1")  # a round trip: notifications sent are in
            return ids, heard
        finally:
            await listener.close()

    (ready, waits), heard = asyncio.run(go())
    assert db.val("SELECT relay_after <= now() FROM jobq.job WHERE id = $1", ready)
    # the one still waiting wakes the settler (to arm its edge), nothing is relayed
    assert sorted(heard) == ["ready", "waits"]
    assert row(db, waits)["held"]


def test_a_released_dependant_still_waits_for_its_own_delay(db: SyncDB) -> None:
    """Found by hand: a job published with after => and a delay of 8 s,
    whose parent took 1 s, was published at the parent's end, dropped by the
    consumer as not due, and ran only when the lost-message check published
    it again (27 s). Released, it must wait for its run_at like any delayed
    job; a dependant without a delay is relayed at once."""
    parent = enqueue(db)
    later = db.val("SELECT jobq.enqueue('q', delay_s => 60, after => $1::uuid[])", [parent])
    now = enqueue(db, after=[parent])
    end(db, parent, "completed")
    assert db.val("SELECT relay_after = run_at AND run_at > now() + interval '50 seconds' "
                  "FROM jobq.job WHERE id = $1", later)
    assert db.val("SELECT relay_after <= now() FROM jobq.job WHERE id = $1", now)


def test_a_job_enqueued_in_the_callers_transaction_can_wait(settings: Settings,
                                                            db: SyncDB) -> None:
    """Client.enqueue (inside the caller's transaction) took every option of
    Client.publish but ``after``."""
    parent = enqueue(db)

    async def go() -> list[Any]:
        conn = await asyncpg.connect(db.url)
        try:
            async with Client(settings) as client:
                async with conn.transaction():
                    kept = await client.enqueue(conn, "q", {}, after=[parent], priority=2)
                try:
                    async with conn.transaction():
                        await client.enqueue(conn, "gone", {}, after=[parent])
                        raise RuntimeError("the caller rolls back")
                except RuntimeError:
                    pass
            return [kept]
        finally:
            await conn.close()

    (kept,) = asyncio.run(go())
    assert (row(db, kept)["waiting_on"], row(db, kept)["held"]) == (1, True)
    assert db.val("SELECT priority FROM jobq.job WHERE id = $1", kept) == 2
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'gone'") == 0
    end(db, parent, "completed")
    assert (row(db, kept)["waiting_on"], row(db, kept)["held"]) == (0, False)
