"""The security review of efa7239 (issue #28), each finding tried as the
login that found it: a consumer against another worker's jobs and schedules
(H2), a producer against another's keys and a cron slot (M2), a forged
NOTIFY against a waiter (M1), one bad schedule against every other sweep
duty (H1)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, run_cli, set_queue
from harness.scratch import login_url
from jobq import App
from jobq.client import results
from jobq.client.results import JobFailed
from jobq.errors import ConfigError
from jobq.reaper import Reaper
from jobq.settings import Settings


def _as(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(url)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(go())


def _login(logins: Any, db: SyncDB, *groups: str) -> str:
    user, password = logins.create(f"s{uuid.uuid4().hex[:8]}", *groups)
    return login_url(db.url, user, password)


def _active(db: SyncDB, queue: str, worker: str) -> tuple[uuid.UUID, uuid.UUID]:
    jid = db.val("SELECT jobq.enqueue($1, '{}')", queue)
    lock = db.val("""UPDATE jobq.job SET status = 'active', lock = gen_random_uuid(),
                     lease_expires_at = now() + interval '1 minute', worker_id = $2,
                     attempts = 1 WHERE id = $1 RETURNING lock""", jid, worker)
    return jid, lock


# ── H2: a consumer login acts only on what its own session holds ──

def test_a_consumer_cannot_fail_a_claimable_job(db: SyncDB, logins: Any) -> None:
    url = logins.url("consumer", db.url)
    jid = db.val("SELECT jobq.enqueue('payments', '{}')")
    (row,) = _as(url, "SELECT * FROM jobq.q_quarantine($1, 'w', '{payments}', $2)",
                 jid, uuid.uuid4())
    assert row["failed"] is False
    job = db.fetchrow("SELECT status, attempts, last_error FROM jobq.job WHERE id = $1", jid)
    assert dict(job) == {"status": "queued", "attempts": 0, "last_error": None}


def test_a_consumer_cannot_borrow_a_live_workers_id(db: SyncDB, logins: Any) -> None:
    """Registering a live worker's id made the reapers cut its leases."""
    url = logins.url("consumer", db.url)

    async def go() -> tuple[Any, Any, Any]:
        live = await asyncpg.connect(url)
        thief = await asyncpg.connect(url)
        try:
            assert await live.fetchval("SELECT pg_try_advisory_lock(4242)")
            assert await live.fetchval("SELECT * FROM jobq.q_worker_register('victim', 'h', 1, "
                                       "4242)") == "victim"
            # another session, with a lock of its own, or with none
            assert await thief.fetchval("SELECT pg_try_advisory_lock(4343)")
            stolen = await thief.fetch("SELECT * FROM jobq.q_worker_register('victim', 'h', 2, "
                                       "4343)")
            unlocked = await thief.fetch("SELECT * FROM jobq.q_worker_register('fresh', 'h', 2, "
                                         "777)")
            gone = await thief.execute("SELECT * FROM jobq.q_worker_gone('victim')")
            return stolen, unlocked, gone
        finally:
            await thief.close()
            await live.close()

    stolen, unlocked, _ = asyncio.run(go())
    assert stolen == [] and unlocked == []
    row = db.fetchrow("SELECT pid, lock_key, vanished_at FROM jobq.worker "
                      "WHERE worker_id = 'victim'")
    assert (row["pid"], row["lock_key"], row["vanished_at"]) == (1, 4242, None)
    assert db.val("SELECT count(*) FROM jobq.worker WHERE worker_id = 'fresh'") == 0


def test_a_worker_id_whose_session_ended_can_be_registered_again(db: SyncDB,
                                                                 logins: Any) -> None:
    url = logins.url("consumer", db.url)

    async def go() -> Any:
        first = await asyncpg.connect(url)
        await first.fetchval("SELECT pg_try_advisory_lock(5151)")
        await first.fetchval("SELECT * FROM jobq.q_worker_register('w9', 'h', 1, 5151)")
        await first.close()  # its lock goes with the session
        second = await asyncpg.connect(url)
        try:
            await second.fetchval("SELECT pg_try_advisory_lock(5252)")
            return await second.fetchval(
                "SELECT * FROM jobq.q_worker_register('w9', 'h', 2, 5252)")
        finally:
            await second.close()

    assert asyncio.run(go()) == "w9"
    assert db.val("SELECT lock_key FROM jobq.worker WHERE worker_id = 'w9'") == 5252


def test_a_consumer_cannot_forge_history_or_take_parked_tokens(db: SyncDB,
                                                              logins: Any) -> None:
    url = logins.url("consumer", db.url)
    theirs, _ = _active(db, "q", "other")
    before = db.val("SELECT count(*) FROM jobq.job_event")
    _as(url, "SELECT * FROM jobq.q_lease_lost_event($1, $2, 'forged')", theirs, uuid.uuid4())
    assert db.val("SELECT count(*) FROM jobq.job_event") == before
    # A job parked by a limit: no token of its spell leaves the database, and
    # nothing is unparked without a finished job of ours in that queue.
    parked = db.val("SELECT jobq.enqueue('limited', '{}')")
    parked_lock = db.val("UPDATE jobq.job SET relay_after = 'infinity', lock = gen_random_uuid() "
                         "WHERE id = $1 RETURNING lock", parked)
    assert _as(url, "SELECT * FROM jobq.q_unpark_freed($1, $2, NULL)", theirs, uuid.uuid4()) == []
    assert db.val("SELECT lock FROM jobq.job WHERE id = $1", parked) == parked_lock
    done, done_lock = _active(db, "limited", "me")
    db.execute("UPDATE jobq.job SET status = 'completed' WHERE id = $1", done)
    second = db.val("SELECT jobq.enqueue('limited', '{}')")
    db.execute("UPDATE jobq.job SET relay_after = 'infinity', lock = gen_random_uuid() "
               "WHERE id = $1", second)
    (row,) = _as(url, "SELECT * FROM jobq.q_unpark_freed($1, $2, $3)", done, done_lock,
                 uuid.uuid4())
    # the token is the database's (issue #47: the caller chose it, and with it
    # read the unparked job's steps and parents), and the proof is spent
    assert row["id"] in (parked, second) and row["lock"] not in (parked_lock, done_lock)
    assert db.val("SELECT lock FROM jobq.job WHERE id = $1", done) == done_lock  # kept
    assert _as(url, "SELECT * FROM jobq.q_unpark_freed($1, $2, $3)", done, done_lock,
               uuid.uuid4()) == []
    assert _as(url, "SELECT * FROM jobq.q_step_get($1, $2, 's')", row["id"], row["lock"]) == []
    assert _as(url, "SELECT * FROM jobq.q_parents($1, $2)", row["id"], row["lock"]) == []
    with pytest.raises(asyncpg.exceptions.UndefinedFunctionError):
        _as(url, "SELECT * FROM jobq.q_hand_back($1)", [parked])


def test_a_consumer_cannot_mark_a_fresh_row_published(db: SyncDB, logins: Any) -> None:
    """A new row's spell has no token (NULL): marking it published without a
    message would hide it until the lost-message check."""
    url = logins.url("consumer", db.url)
    fresh = db.val("SELECT jobq.enqueue('q', '{}')")
    with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
        _as(url, "SELECT * FROM jobq.q_mark_published($1, $2)", [fresh], [None])
    _as(url, "SELECT * FROM jobq.q_mark_republished($1, $2)", [fresh], [None])
    assert db.val("SELECT published_at FROM jobq.job WHERE id = $1", fresh) is None


def test_schedules_are_the_operators(db: SyncDB, logins: Any) -> None:
    """A consumer alone stores no schedule (a schedule enqueues jobs); a
    consumer that is also a producer stores its app's, never an operator's."""
    consumer = logins.url("consumer", db.url)
    both = _login(logins, db, "jobq_consumer", "jobq_producer")
    db.execute("INSERT INTO jobq.schedule (name, queue, payload, interval_s, next_run_at) "
               "VALUES ('nightly', 'reports', '{\"who\": \"ops\"}', 60, now() + interval '1h')")
    declare = ("SELECT * FROM jobq.q_schedule_upsert($1, 'reports', '{\"who\": \"app\"}', NULL, "
               "'UTC', 5, now(), true)")
    assert _as(consumer, declare, "mine") == []
    assert _as(both, declare, "nightly") == []
    assert db.val("SELECT payload->>'who' FROM jobq.schedule WHERE name = 'nightly'") == "ops"
    assert [r["name"] for r in _as(both, declare, "mine")] == ["mine"]
    assert db.val("SELECT source FROM jobq.schedule WHERE name = 'mine'") == "app"


# ── M2: keys do not leak across producer logins; cron slots are the reapers' ──

def test_idempotency_keys_are_per_login(db: SyncDB, logins: Any) -> None:
    """A key is its login's (issue #47): another login that used it first
    neither refuses alice's publish nor learns her job's id."""
    alice = logins.url("producer", db.url)
    mallory = _login(logins, db, "jobq_producer")
    (m,) = _as(mallory, "SELECT jobq.enqueue('orders', '{}', 0, 'order-7') AS id")
    (a,) = _as(alice, "SELECT jobq.enqueue('orders', '{}', 0, 'order-7') AS id")
    (again,) = _as(alice, "SELECT jobq.enqueue('orders', '{}', 0, 'order-7') AS id")
    assert again["id"] == a["id"] != m["id"]  # the same login keeps its idempotency
    (m2,) = _as(mallory, "SELECT jobq.enqueue('orders', '{}', 0, 'order-7') AS id")
    assert m2["id"] == m["id"]
    with pytest.raises(asyncpg.exceptions.CheckViolationError, match="reserved"):
        _as(mallory, "SELECT jobq.enqueue('reports', '{}', 0, "
                     "'schedule:nightly:2026-12-04T03:00:00.000000Z')")


# ── M1: a NOTIFY is a hint; the row is the answer ──

def test_a_forged_notify_does_not_end_a_wait(settings: Settings, db: SyncDB) -> None:
    jid = db.val("SELECT jobq.enqueue('slow', '{}')")

    async def go() -> None:
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
        forger = await asyncpg.connect(settings.database_url)
        try:
            waiter = asyncio.ensure_future(results.wait(pool, jid, 1.5))
            await asyncio.sleep(0.3)  # let it LISTEN
            await forger.execute("SELECT pg_notify('jobq_finished', $1)", str(jid))
            with pytest.raises(TimeoutError):
                await waiter
            # and a real end still ends it
            waiter = asyncio.ensure_future(results.wait(pool, jid, 10))
            await asyncio.sleep(0.3)
            await forger.execute("UPDATE jobq.job SET status = 'failed', last_error = 'x', "
                                 "finished_at = now() WHERE id = $1", jid)
            with pytest.raises(JobFailed):
                await waiter
        finally:
            await forger.close()
            await pool.close()

    asyncio.run(go())


# ── H1: one bad schedule stops nothing else ──

def test_bad_schedules_are_refused_where_they_are_written(env: dict[str, str], db: SyncDB) -> None:
    set_queue(db, "tiny", max_payload_bytes=100)
    big = '{"blob": "' + "x" * 200 + '"}'
    out = run_cli(env, "schedule", "set", "toobig", "tiny", "--every", "60", "--payload", big)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "over the 100 byte limit" in out.stderr
    out = run_cli(env, "schedule", "set", "six", "tiny", "--cron", "0 0 3 * * *")
    assert out.returncode == 1 and "five fields" in out.stderr, out.stderr
    with pytest.raises(asyncpg.exceptions.CheckViolationError):
        db.execute("INSERT INTO jobq.schedule (name, queue, cron, next_run_at) "
                   "VALUES ('sql6', 'tiny', '0 0 3 * * *', now())")
    assert db.val("SELECT count(*) FROM jobq.schedule") == 0


def test_one_bad_schedule_stops_no_other_sweep_duty(settings: Settings, db: SyncDB) -> None:
    """A schedule over its queue's (since lowered) limit and one whose cron
    no longer parses are due first; the sweep still fires the good schedule,
    relays an SQL enqueue and requeues a lapsed lease, and each bad schedule
    gets its error on its row and steps out of the way."""
    db.execute("""INSERT INTO jobq.schedule (name, queue, payload, cron, interval_s, next_run_at)
                  VALUES ('big', 'tiny', jsonb_build_object('blob', repeat('x', 200)), NULL, 60,
                          now() - interval '2 min'),
                         ('badcron', 'tiny', '{}', '99 * * * *', NULL, now() - interval '2 min'),
                         ('good', 'ok', '{}', NULL, 60, now() - interval '1 min')""")
    set_queue(db, "tiny", max_payload_bytes=100)  # lowered after the schedule was set
    sql_job = db.val("SELECT jobq.enqueue('ok', '{}')")
    lapsed, _ = _active(db, "ok", "dead-worker")
    db.execute("UPDATE jobq.job SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
               lapsed)

    async def go() -> Any:
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        try:
            return await reaper.run_once()
        finally:
            await reaper.close()

    sweep = asyncio.run(go())
    assert sweep.errors == {} and sweep.requeued == [str(lapsed)]
    assert db.val("SELECT published_at IS NOT NULL FROM jobq.job WHERE id = $1", sql_job)
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'ok' AND idempotency_key "
                  "LIKE 'schedule:good:%'") == 1
    rows = {r["name"]: r for r in db.fetch(
        "SELECT name, enabled, last_error, next_run_at > now() AS ahead FROM jobq.schedule")}
    assert "over the 100 byte limit" in rows["big"]["last_error"] and rows["big"]["ahead"]
    assert rows["big"]["enabled"]
    assert rows["badcron"]["last_error"] and not rows["badcron"]["enabled"]
    assert rows["good"]["last_error"] is None and rows["good"]["ahead"]


def test_a_refused_app_schedule_is_logged_and_skipped(db: SyncDB, logins: Any,
                                                    caplog: Any) -> None:
    """A consumer stores what it may and goes on: an operator's schedule of
    the same name, or one over its queue's limit, is one log line each."""
    from jobq.schedules import Schedule
    from jobq.worker.store import declare_schedules as declare

    both = _login(logins, db, "jobq_consumer", "jobq_producer")
    set_queue(db, "tiny", max_payload_bytes=100)
    db.execute("INSERT INTO jobq.schedule (name, queue, interval_s, next_run_at) "
               "VALUES ('ops', 'tiny', 60, now())")
    wanted = [Schedule("ops", "tiny", {}, every_s=5), Schedule("big", "tiny", {"b": "x" * 200},
                                                               every_s=5),
              Schedule("fine", "tiny", {}, every_s=5)]

    async def go() -> int:
        conn = await asyncpg.connect(both)
        try:
            return await declare(conn, wanted)
        finally:
            await conn.close()

    assert asyncio.run(go()) == 1
    assert sorted(r["name"] for r in db.fetch("SELECT name FROM jobq.schedule")) == ["fine", "ops"]
    refusals = [r for r in caplog.records if "not stored" in r.getMessage()]
    assert len(refusals) == 2
    with pytest.raises(ConfigError, match="five fields"):  # at import: the app is wrong
        App().schedule("s", "q", cron="0 0 3 * * *")
