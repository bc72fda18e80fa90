"""Deadlines (issue #51, item 7; schema 0031): a job published with
``expires_in_s`` and not started by then is cancelled with reason
``expired`` and never runs — the claim refuses it whatever message brings
it (the lean and the full claim), the reapers cancel it at its deadline
(its dependants with it, with the reason); a job that started before its
deadline is never cut short by it. From Python, SQL and the CLI; bad input
gets one line."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, run_cli, set_queue
from harness.helpers import with_pool as run
from jobq import lease
from jobq.amqp.broker import Broker
from jobq.client.producer import Client
from jobq.errors import InvalidPayload
from jobq.reaper import Reaper
from jobq.reaper.store import PgReaperStore
from jobq.rows import Probe
from jobq.settings import Settings
from tests.integration.test_cli import one_line_error

EXPIRE = Probe(False, False, False, False, False, None, expiring=True)


async def _past_deadline(pool: asyncpg.Pool, *ids: uuid.UUID) -> None:
    """Until the database clock is past each job's deadline (event, not sleep)."""
    for _ in range(500):
        if await pool.fetchval("SELECT bool_and(expires_at < now()) FROM jobq.job "
                               "WHERE id = ANY($1::uuid[])", list(ids)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("deadline never passed")


def _reaper(settings: Settings, pool: asyncpg.Pool) -> Reaper:
    return Reaper(settings, PgReaperStore(pool, Broker("", "unused")))


@pytest.mark.parametrize("limited", [False, True], ids=["lean-claim", "full-claim"])
def test_an_expired_job_is_never_claimed_and_the_reapers_cancel_it(
        settings: Settings, db: SyncDB, limited: bool) -> None:
    set_queue(db, "dl", **({"max_running": 100} if limited else {}))

    async def body(pool: asyncpg.Pool) -> None:
        async with Client(settings) as client:
            doomed = await client.publish("dl", {"n": 1}, expires_in_s=0.3)
            kept = await client.publish("dl", {"n": 2}, expires_in_s=600)
            child = await client.publish("dl", {}, after=[doomed])
        await _past_deadline(pool, doomed)
        got = await lease.claim(pool, [doomed, kept], "w", ["dl"])
        assert [c.id if c else None for c in got] == [None, kept]  # refused, not taken
        misses = await lease.claim_misses(pool, [doomed])
        assert misses[doomed].expired and misses[doomed].status == "queued"
        # the reapers' expire duty: the probe says so, the sweep cancels it,
        # and its dependant goes with it (same sweep), with the reason
        reaper = _reaper(settings, pool)
        probe = await reaper.probe()
        assert probe.expiring
        sweep = await reaper.run_once(Probe(False, False, False, False, False, None,
                                            expiring=True, dependants=True))
        assert sweep.expired == 1, sweep
        row = await pool.fetchrow("SELECT status, last_error, started_at FROM jobq.job "
                                  "WHERE id = $1", doomed)
        assert row is not None and (row["status"], row["started_at"]) == ("cancelled", None)
        assert row["last_error"].startswith("expired"), row["last_error"]
        dep = await pool.fetchrow("SELECT status, last_error FROM jobq.job WHERE id = $1",
                                  child)
        assert dep is not None, child
        assert dep["status"] == "cancelled" and str(doomed) in dep["last_error"], dict(dep)
        events = [r["event"] for r in await pool.fetch(
            "SELECT event FROM jobq.job_event WHERE job_id = $1", doomed)]
        assert events == ["cancelled"], events
        assert not (await reaper.probe()).expiring  # nothing left to expire

    run(settings.database_url, body)


@pytest.mark.parametrize("limited", [False, True], ids=["lean-claim", "full-claim"])
def test_a_claim_that_waited_for_the_row_past_its_deadline_does_not_start_it(
        settings: Settings, db: SyncDB, limited: bool) -> None:
    """The claim's transaction began before the deadline, then waited for a
    row another transaction held (a relay's, a reaper frozen mid-sweep) until
    after it: checked against the transaction's start, the job started late
    (CI's nemesis saw a first claim after expires_at). The deadline is checked
    once the row is ours."""
    set_queue(db, "dl", **({"max_running": 100} if limited else {}))

    async def body(pool: asyncpg.Pool) -> None:
        async with Client(settings) as client:
            jid = await client.publish("dl", {}, expires_in_s=0.5)
        holder = await asyncpg.connect(settings.database_url)
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM jobq.job WHERE id = $1 FOR UPDATE", jid)
            claim = asyncio.ensure_future(lease.claim(pool, [jid], "w", ["dl"]))
            for _ in range(500):  # until the claim waits for the row (event, not sleep)
                if await pool.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()"):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the claim never waited for the row")
            await _past_deadline(pool, jid)
            await tx.rollback()  # the row is free again, unchanged
            assert await claim == [None]
        finally:
            await holder.close()
        row = await pool.fetchrow("SELECT status, started_at FROM jobq.job WHERE id = $1", jid)
        assert row is not None and (row["status"], row["started_at"]) == ("queued", None)
        assert (await lease.claim_misses(pool, [jid]))[jid].expired

    run(settings.database_url, body)


def test_a_job_started_before_its_deadline_is_not_cut_short(settings: Settings) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        async with Client(settings) as client:
            jid = await client.publish("dl", {}, expires_in_s=2)  # claimed well before it
        (claim,) = await lease.claim(pool, [jid], "w", ["dl"])
        assert claim is not None
        await _past_deadline(pool, jid)
        assert (await _reaper(settings, pool).run_once(EXPIRE)).expired == 0
        assert await lease.complete(pool, [lease.Lease.from_claim(claim, 0.0, 0.15)]) == [True]
        # and a re-run after a stall is no fresh start either: it runs
        jid2 = await pool.fetchval("SELECT jobq.enqueue('dl', expires_in_s => 2)")
        (c2,) = await lease.claim(pool, [jid2], "w", ["dl"])
        assert c2 is not None
        await pool.execute("UPDATE jobq.job SET status = 'queued', lock = NULL, "
                           "lease_expires_at = NULL WHERE id = $1", jid2)  # as a requeue
        await _past_deadline(pool, jid2)
        (again,) = await lease.claim(pool, [jid2], "w", ["dl"])
        assert again is not None and again.attempts == 2

    run(settings.database_url, body)


def test_bad_deadlines_get_one_line_from_python_sql_and_the_cli(
        settings: Settings, db: SyncDB, env: dict[str, str]) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        async with Client(settings) as client:
            for bad, why in ((-1, "positive"), (float("nan"), "positive"), (0, "positive"),
                             (True, "positive")):
                with pytest.raises(InvalidPayload, match=why):
                    await client.publish("dl", {}, expires_in_s=bad)
            with pytest.raises(InvalidPayload, match="could never start"):
                await client.publish("dl", {}, delay_s=10, expires_in_s=5)
            with pytest.raises(InvalidPayload, match="debounced"):
                await client.publish("dl", {}, key="k", debounce_s=1, expires_in_s=5)
        for args in ("expires_in_s => 'NaN'", "expires_in_s => -2",
                     "delay_s => 10, expires_in_s => 5"):
            with pytest.raises(asyncpg.InvalidParameterValueError, match="expires_in_s"):
                await pool.fetchval(f"SELECT jobq.enqueue('dl', {args})")
        assert await pool.fetchval("SELECT count(*) FROM jobq.job") == 0  # nothing stored

    run(settings.database_url, body)
    one_line_error(run_cli(env, "publish", "dl", "{}", "--expires-in", "-1"), 1, "expires_in_s")
    out = run_cli(env, "publish", "dl", "{}", "--expires-in", "60")
    assert out.returncode == 0, out.stderr
    jid = uuid.UUID(out.stdout.strip())
    left: Any = db.val("SELECT extract(epoch FROM expires_at - created_at) FROM jobq.job "
                       "WHERE id = $1", jid)
    assert 59 < left <= 60.5
    assert "expires_at" in run_cli(env, "inspect", str(jid)).stdout
