"""Jobs that wait without holding anything (issue #52, DESIGN I12): a
durable sleep ends the run and the job comes back by the database clock; a
wait for a signal ends the run until jobq.signal stores one (kept when sent
before the wait, kept only if its transaction commits), or until its timeout
(SignalTimeout in the handler). While it waits the job is queued with no
lease and no worker; the re-run answers earlier steps from the record and
counts no attempt. Real consumer and reaper (harness/waits.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import pytest

from jobq.client.workflow import Workflow
from jobq.errors import BadInput, UnknownJob
from jobq.ops import admin
from jobq.settings import Settings
from jobq.sql import BODY, statements
from tests.integration.test_consumer import World, _app_db, scenario  # noqa: F401


async def _runs(w: World, jid: uuid.UUID) -> list[Any]:
    return await w.pool.fetch("SELECT started_at, outcome FROM test_run WHERE job_id = $1 "
                              "ORDER BY n", jid)


async def _suspended(w: World, jid: uuid.UUID) -> Any:
    """Once the job's first run ended to wait: its row then."""
    for _ in range(500):
        row = await w.row(jid)
        if row["status"] == "queued" and row["started_at"] is not None:
            return row
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {jid} never suspended: {dict(await w.row(jid))}")


def _result(row: Any) -> Any:
    return json.loads(row["result"]) if isinstance(row["result"], str) else row["result"]


def test_a_durable_sleep_holds_nothing_and_the_rerun_continues_after_it(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("waits", {"sleep_s": 1.0})
        row = await _suspended(w, jid)  # I12: no lease, no worker's slot
        assert row["lease_expires_at"] is None and row["attempts"] == 0, dict(row)
        done = await w.wait_status(jid, "completed")
        runs = await _runs(w, jid)
        assert [r["outcome"] for r in runs] == ["suspended", "returned"], runs
        assert (runs[1]["started_at"] - runs[0]["started_at"]).total_seconds() >= 1.0
        first = await w.pool.fetchval("SELECT result #>> '{}' FROM jobq.job_step "
                                      "WHERE job_id = $1 AND name = 'first'", jid)
        assert _result(done)["first"] == first  # the re-run got the recorded step
        assert done["attempts"] == 1 and done["errors"] == 0, dict(done)
        events = [r["event"] for r in await w.pool.fetch(
            "SELECT event FROM jobq.job_event WHERE job_id = $1 ORDER BY at, n", jid)]
        assert "suspended" in events, events

    scenario(settings, body, queues=["waits"])


def test_a_signal_wakes_the_waiting_job_once_and_its_payload_is_returned(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("waits", {"signal": "approve"})
        row = await _suspended(w, jid)
        assert row["wake_on"] == "approve" and row["lease_expires_at"] is None
        backlog = await w.pool.fetchrow("SELECT * FROM jobq.backlog WHERE queue = 'waits'")
        assert backlog is not None
        assert (backlog["suspended"], backlog["ready"]) == (1, 0), dict(backlog)  # issue #50
        assert await w.client.signal(jid, "approve", {"by": "ana"}) is True
        assert await w.client.signal(jid, "approve", {"by": "bob"}) is False  # first kept
        done = await w.wait_status(jid, "completed")
        assert _result(done)["got"] == {"by": "ana"}, dict(done)
        runs = await _runs(w, jid)
        assert [r["outcome"] for r in runs] == ["suspended", "returned"], runs
        with pytest.raises(BadInput, match="ended"):
            await w.client.signal(jid, "late", 1)
        with pytest.raises(UnknownJob):
            await w.client.signal(uuid.uuid4(), "x", 1)
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job_signal") == 1

    scenario(settings, body, queues=["waits"])


def test_a_signal_sent_before_the_wait_is_kept(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.client.publish_many(
            [__import__("jobq").NewJob("waits", {"signal": "go"}, delay_s=1.0)])
        assert await w.client.signal(jid, "go", [1, 2]) is True  # still queued
        done = await w.wait_status(jid, "completed")
        assert _result(done)["got"] == [1, 2]
        assert [r["outcome"] for r in await _runs(w, jid)] == ["returned"]

    scenario(settings, body, queues=["waits"])


def test_a_rolled_back_signal_wakes_nothing_and_a_timeout_raises_in_the_handler(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("waits", {"signal": "approve", "timeout_s": 3})
        await _suspended(w, jid)
        conn = await asyncpg.connect(w.settings.database_url)
        try:
            tx = conn.transaction()
            await tx.start()
            assert await w.client.signal(jid, "approve", "no", conn=conn) is True
            await tx.rollback()
        finally:
            await conn.close()
        done = await w.wait_status(jid, "completed")  # the timeout, not the signal
        assert _result(done) == {"first": _result(done)["first"], "timed_out": True}
        assert [r["outcome"] for r in await _runs(w, jid)] == ["suspended", "timed_out"]
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job_signal") == 0

        # The same in SQL, committed: the job wakes at once, long before its timeout.
        (other,) = await w.publish("waits", {"signal": "approve", "timeout_s": 60})
        await _suspended(w, other)
        assert await w.pool.fetchval("SELECT jobq.signal($1, 'approve', '\"yes\"')", other)
        done = await w.wait_status(other, "completed", timeout=10)
        assert _result(done)["got"] == "yes"

    scenario(settings, body, queues=["waits"])


def test_children_spawned_once_each_and_joined_with_errors_as_values(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("waits", {"spawn": 3, "children": [
            {"sleep": 0.3}, {"fail_now": True}, {}]})
        done = await w.wait_status(jid, "completed", timeout=20)
        assert _result(done)["got"] == [None, {"failed": "failed"}, None], dict(done)
        kids = await w.pool.fetch("SELECT (result #>> '{}')::uuid AS id FROM jobq.job_step "
                                  "WHERE job_id = $1 AND name LIKE 'spawn:%'", jid)
        assert len(kids) == 3
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job WHERE queue = 'work'") == 3
        assert [r["outcome"] for r in await _runs(w, jid)][-1] == "returned"
        assert done["attempts"] == 1 and done["joining"] is None

        # A joining parent cancelled: the children it still waits for with it.
        (parent,) = await w.publish("waits", {"spawn": 2, "children": [{"sleep": 30}]})
        row = await _suspended(w, parent)
        assert row["joining"] is not None and len(row["joining"]) == 2
        await admin.cancel(w.pool, parent, "no longer needed")  # as `jobq cancel` runs it
        for kid in row["joining"]:
            await w.wait_status(kid, "cancelled")
        # no join pending any more: the reapers' probe stops waking its duty
        # (a cancelled parent kept it on for good, every sweep)
        probe = await w.pool.fetchrow(statements(BODY["sweep_probe"])[-1])
        assert probe is not None and probe["signals"] is False, dict(probe or {})

    scenario(settings, body, queues=["waits", "work"])


def test_what_a_suspended_job_waits_for_since_when_and_who_it_spawned(
        settings: Settings) -> None:
    """Issue #52, item 6: jobq.backlog (the reapers' gauges) counts suspended
    jobs by reason, a durable sleep among them (it counted as delayed);
    jobq inspect and the job page say since when and when the clock wakes
    it; a parent's spawned child shows on both pages and in its workflow."""
    async def body(w: World) -> None:
        (sleeper, waiter) = await w.publish("waits", {"sleep_s": 60}, {"signal": "approve"})
        wf = Workflow()
        wf.step("waits", {"spawn": 1, "children": [{"sleep": 30}]})
        wid = await w.client.publish_workflow(wf)
        (parent,) = [r["id"] for r in await admin.workflow(w.pool, wid)]
        for jid in (sleeper, waiter, parent):
            await _suspended(w, jid)
        b = await w.pool.fetchrow("SELECT * FROM jobq.backlog WHERE queue = 'waits'")
        assert b is not None
        assert (b["suspended"], b["delayed"], b["suspended_sleep"], b["suspended_signal"],
                b["suspended_children"]) == (3, 0, 1, 1, 1), dict(b)
        assert b["oldest_suspended_s"] >= 0
        slept, _ = await admin.inspect(w.pool, sleeper)
        waited, _ = await admin.inspect(w.pool, waiter)
        assert slept["suspended_since"] is not None and waited["suspended_since"] is not None
        assert (slept["wakes_at"] - slept["suspended_since"]).total_seconds() >= 59, dict(slept)
        assert waited["wakes_at"] is None  # a wait with no timeout: no clock wakes it
        links, _ = await admin.links_and_steps(w.pool, parent)
        (child,) = [r["id"] for r in links if r["link"] == "spawned"]
        back, _ = await admin.links_and_steps(w.pool, child)
        assert [(r["link"], r["id"]) for r in back] == [("spawned by", parent)], back
        steps = await admin.workflow(w.pool, wid)
        assert {(r["id"], r["spawned_by"]) for r in steps} == {(parent, None), (child, parent)}
        await admin.cancel(w.pool, parent, "done looking")  # the child with it
        await w.wait_status(child, "cancelled")
        again, _ = await admin.inspect(w.pool, parent)
        assert again["suspended_since"] is None  # it waits no more

    scenario(settings, body, queues=["waits", "work"])


def test_a_sync_handler_sleeps_waits_spawns_and_joins_with_the_sync_twins(
        settings: Settings) -> None:
    """Issue #52.6: job.sleep_sync, wait_for_sync, spawn_sync, join_sync from a
    sync handler in the consumer's thread pool end its run and bring it back
    as the async calls do (no attempt counted, steps answered from the record)."""
    async def body(w: World) -> None:
        (jid,) = await w.publish("waits_sync", {"sleep_s": 0.3, "signal": "go", "spawn": 2})
        for _ in range(500):
            if (await w.row(jid))["wake_on"] == "go":
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"never waited for its signal: {dict(await w.row(jid))}")
        assert await w.client.signal(jid, "go", {"ok": 1}) is True
        done = await w.wait_status(jid, "completed", timeout=20)
        assert _result(done)["got"] == [{"ok": 1}, [None, None]], dict(done)
        assert done["attempts"] == 1 and done["errors"] == 0, dict(done)
        suspended = await w.pool.fetchval("SELECT count(*) FROM jobq.job_event WHERE job_id = $1 "
                                          "AND event = 'suspended'", jid)
        assert suspended == 3, suspended  # the sleep, the signal, the join
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job WHERE queue = 'work'") == 2

    scenario(settings, body, queues=["waits_sync", "work"])


def test_bad_input_fails_that_job_at_once_and_touches_nothing_else(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #52, bad input and limits: a negative or NaN sleep, a join on a
    job it did not spawn, a child over the queue's payload limit, more
    children than the cap: each fails its job at once (1 attempt, the reason
    in last_error), with no child beyond what the cap allowed."""
    from jobq.worker import suspension
    monkeypatch.setattr(suspension, "MAX_CHILDREN", 2)  # 1,000 in production

    async def body(w: World) -> None:
        (other,) = await w.publish("work", {})
        await w.pool.execute("UPDATE jobq.queue SET max_payload_bytes = 200 "
                             "WHERE name = 'work'")
        cases = {
            "finite number of seconds": {"sleep_s": -1},
            "finite number of seconds ": {"sleep_s": "nan"},
            "is not one": {"join": [str(other)]},
            "max_payload_bytes": {"spawn": 1, "children": [{"big": "x" * 500}]},
            "at most 2 children": {"spawn": 3, "children": [{}]},
        }
        ids = await w.publish("waits", *cases.values())
        for why, jid in zip(cases, ids, strict=True):
            row = await w.wait_status(jid, "failed", timeout=20)
            assert why.strip() in row["last_error"], dict(row)
            assert row["attempts"] == 1, dict(row)
        capped = ids[-1]
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job_step WHERE job_id = $1 "
                                     "AND name LIKE 'spawn:%'", capped) == 2
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job WHERE queue = 'work'") == 3

    scenario(settings, body, queues=["waits", "work"])
