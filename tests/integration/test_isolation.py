"""Nobody else's work can stop yours (issue #47, DESIGN I11), each finding
tried as the login that found it: a producer's open transaction against a
worker's renewals and completions (H1), debounce across logins (H2), trace
records (H3), a 1,000-long chain and 50,000 dependants (H5), an advisory
lock any login can take (M6), the least-privileged producer's publishes (M8),
schedules across app logins (M9), and the lows that have a database side."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, run_cli, set_queue
from harness.scratch import login_url
from jobq import lease
from jobq.lease import Lease
from jobq.sql import Q


def _login(logins: Any, db: SyncDB, *groups: str) -> str:
    user, password = logins.create(f"i{uuid.uuid4().hex[:8]}", *groups)
    return login_url(db.url, user, password)


def _as(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(url)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(go())


def settle(db: SyncDB) -> Any:
    return db.fetchrow("SELECT * FROM jobq.settle_dependants(1000)")


# ── H1: a producer's open transaction holds nothing a worker waits on ──

def test_a_producers_open_transaction_never_holds_a_workers_renewal_or_completion(
        db: SyncDB, logins: Any) -> None:
    """Found by review: enqueue(after => [a running job]) and q_watch locked
    the parent row until the producer committed; the worker's one renewal
    statement waited on it and every job of that worker self-fenced."""
    producer, consumer = logins.url("producer", db.url), logins.url("consumer", db.url)
    parent = db.val("SELECT jobq.enqueue('work', '{}')")
    other = db.val("SELECT jobq.enqueue('work', '{}')")

    async def go() -> Any:
        pool = await asyncpg.create_pool(consumer, min_size=1, max_size=2)
        held = await asyncpg.connect(producer)
        try:
            rows = await lease.claim(pool, [parent, other], "w1", ["work"])
            leases = [Lease.from_claim(r, 0.0, 0.15) for r in rows if r is not None]
            assert len(leases) == 2
            tx = held.transaction()
            await tx.start()
            dep = await held.fetchval("SELECT jobq.enqueue('after', '{}', after => $1::uuid[])",
                                      [parent])
            await held.fetch("SELECT * FROM jobq.q_watch($1)", parent)
            # the worker renews and completes as if nobody were there
            renewed = await asyncio.wait_for(lease.renew(pool, leases, "w1"), 5)
            assert renewed.renewed == {parent, other} and not renewed.busy
            assert await asyncio.wait_for(lease.complete(pool, leases), 5) == [True, True]
            await tx.commit()
            return dep
        finally:
            await held.close()
            await pool.close()

    dep = asyncio.run(go())
    # the parent ended before the dependant's edge was committed: the
    # settler sees it all the same, once
    assert db.val("SELECT waiting_on FROM jobq.job WHERE id = $1", dep) == 1
    assert settle(db)["released"] == 1
    assert db.val("SELECT waiting_on FROM jobq.job WHERE id = $1", dep) == 0


# ── H2: debounce merges only into its own login's debounced job ──

def test_debounce_merges_only_into_a_job_its_own_login_debounced(
        db: SyncDB, logins: Any) -> None:
    alice, mallory = logins.url("producer", db.url), _login(logins, db, "jobq_producer")
    (a,) = _as(alice, "SELECT jobq.enqueue('digest', '{\"by\": \"alice\"}', key => 'u1', "
                      "debounce_s => 60) AS id")
    (m,) = _as(mallory, "SELECT jobq.enqueue('digest', '{\"by\": \"mallory\"}', key => 'u1', "
                        "debounce_s => 60) AS id")
    assert m["id"] != a["id"]
    assert db.val("SELECT payload->>'by' FROM jobq.job WHERE id = $1", a["id"]) == "alice"
    # nor into a job of its own published without debounce
    (plain,) = _as(alice, "SELECT jobq.enqueue('digest', '{}', 60, key => 'u2') AS id")
    (deb,) = _as(alice, "SELECT jobq.enqueue('digest', '{}', key => 'u2', debounce_s => 30) AS id")
    assert deb["id"] != plain["id"]
    (again,) = _as(alice, "SELECT jobq.enqueue('digest', '{\"n\": 2}', key => 'u1', "
                          "debounce_s => 60) AS id")
    assert again["id"] == a["id"]  # its own debounce still merges


# ── H3: trace records ──

def test_only_the_enqueue_functions_write_trace_records_and_only_string_headers(
        db: SyncDB, logins: Any) -> None:
    producer = logins.url("producer", db.url)
    jid = db.val("SELECT jobq.enqueue('work', '{}')")
    with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
        _as(producer, "INSERT INTO jobq.job_trace VALUES ($1, '{\"traceparent\": \"x\"}')", jid)
    with pytest.raises(asyncpg.exceptions.CheckViolationError):
        db.execute("INSERT INTO jobq.job_trace VALUES ($1, '{\"traceparent\": 5}')", jid)


def test_an_unreadable_trace_carrier_is_ignored() -> None:
    pytest.importorskip("opentelemetry.sdk.trace", reason="the jobq[otel] test extra")
    from jobq.telemetry import tracing

    class J:
        id = uuid.uuid4()

    for bad in ('{"traceparent": 5}', "[1, 2]", "not json", '{"traceparent": "junk"}'):
        assert tracing._parent(J(), bad) is not None  # a context, never an exception


# ── H5: a long chain and a wide fan-out cost a bounded batch a sweep ──

def test_a_1000_long_chain_is_cancelled_iteratively_and_bounded(
        db: SyncDB, env: dict[str, str]) -> None:
    ids = db.val("""
        WITH RECURSIVE chain(n, id) AS (
            SELECT 1, jobq.enqueue('chain', '{}')
            UNION ALL
            SELECT n + 1, jobq.enqueue('chain', '{}', after => ARRAY[id]) FROM chain
            WHERE n < 1000)
        SELECT array_agg(id ORDER BY n) FROM chain""")
    assert settle(db)["more"] is not None  # arms the new edges
    out = run_cli(env, "cancel", str(ids[0]))  # the head, as an operator
    assert out.returncode == 0, out.stderr
    calls = 0
    while db.val("SELECT count(*) FROM jobq.job WHERE status = 'queued' AND queue = 'chain'"):
        got = db.fetchrow("SELECT * FROM jobq.settle_dependants(1000, 100)")
        assert got["cancelled"] <= 100  # a level a round, 100 rounds a call
        calls += 1
        assert calls <= 20
    assert calls >= 10
    assert db.val("SELECT count(*) FROM jobq.job WHERE status = 'cancelled'") == 1000
    last = db.val("SELECT last_error FROM jobq.job WHERE id = $1", ids[-1])
    assert last == f"cancelled: job {ids[-2]} it waits for was cancelled"


def test_completing_a_job_with_50000_dependants_touches_none_of_them(db: SyncDB) -> None:
    parent = db.val("SELECT jobq.enqueue('fan', '{}')")
    set_queue(db, "fan-out")
    db.execute("""
        WITH deps AS (
            INSERT INTO jobq.job (queue, payload, waiting_on, relay_after)
            SELECT 'fan-out', '{}', 1, 'infinity' FROM generate_series(1, 50000)
            RETURNING id)
        INSERT INTO jobq.job_dependency (parent_id, job_id, state)
        SELECT $1, id, 'armed' FROM deps""", parent)
    db.execute("UPDATE jobq.job SET has_dependants = true WHERE id = $1", parent)

    async def go() -> None:
        pool = await asyncpg.create_pool(db.url, min_size=1, max_size=2)
        try:
            (row,) = await lease.claim(pool, [parent], "w1", ["fan"])
            assert row is not None
            assert await lease.complete(pool, [Lease.from_claim(row, 0.0, 0.15)]) == [True]
        finally:
            await pool.close()

    asyncio.run(go())
    # the completion's transaction released nobody: the reapers do, in batches
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'fan-out' "
                  "AND waiting_on = 0") == 0
    got = settle(db)
    assert (got["released"], got["more"]) == (1000, True)
    while settle(db)["more"]:
        pass
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'fan-out' "
                  "AND waiting_on = 0 AND relay_after <= now()") == 50000


# ── M6: the claim waits on no lock another login can take ──

def test_a_per_key_claim_does_not_wait_on_an_advisory_lock_anyone_can_take(
        db: SyncDB, logins: Any) -> None:
    set_queue(db, "tenants", max_running_per_key=2)
    jid = db.val("SELECT jobq.enqueue('tenants', '{}', key => 'acme')")
    nobody = _login(logins, db)  # no jobq role at all
    consumer = logins.url("consumer", db.url)

    async def go() -> None:
        squatter = await asyncpg.connect(nobody)
        pool = await asyncpg.create_pool(consumer, min_size=1, max_size=2)
        try:
            await squatter.execute("SELECT pg_advisory_lock(hashtext('tenants'), "
                                   "hashtext('acme'))")
            (row,) = await asyncio.wait_for(lease.claim(pool, [jid], "w1", ["tenants"]), 5)
            assert row is not None
        finally:
            await squatter.close()
            await pool.close()

    asyncio.run(go())


# ── M9: an app's schedule is its login's ──

def test_an_app_login_cannot_overwrite_another_apps_schedule(db: SyncDB, logins: Any) -> None:
    billing = _login(logins, db, "jobq_consumer", "jobq_producer")
    other = _login(logins, db, "jobq_consumer", "jobq_producer")
    store = ("SELECT * FROM jobq.q_schedule_upsert($1, 'bill', $2::jsonb, $3, 'UTC', NULL, "
             "now() + interval '1 hour', true)")
    assert _as(billing, store, "nightly", '{"amount": 10}', "0 3 * * *")
    assert not _as(other, store, "nightly", '{"amount": 999}', "*/5 * * * *")
    row = db.fetchrow("SELECT cron, payload->>'amount' AS amount FROM jobq.schedule "
                      "WHERE name = 'nightly'")
    assert (row["cron"], row["amount"]) == ("0 3 * * *", "10")
    assert _as(billing, store, "nightly", '{"amount": 11}', "0 3 * * *")  # its own: yes


# ── lows with a database side ──

def test_a_producer_cannot_mark_or_ask_about_another_logins_jobs(
        db: SyncDB, logins: Any) -> None:
    alice, mallory = logins.url("producer", db.url), _login(logins, db, "jobq_producer")
    (a,) = _as(alice, "SELECT jobq.enqueue('work', '{}') AS id")
    _as(mallory, "SELECT jobq.q_mark_published($1, $2)", [a["id"]], [None])
    assert db.val("SELECT published_at FROM jobq.job WHERE id = $1", a["id"]) is None
    set_queue(db, "capped", max_running_per_key=1)
    ids = [_as(alice, "SELECT jobq.enqueue('capped', '{}', key => 'k') AS id")[0]["id"]
           for _ in range(2)]
    assert len(_as(alice, "SELECT * FROM jobq.q_held_back($1)", ids)) == 1
    assert _as(mallory, "SELECT * FROM jobq.q_held_back($1)", ids) == []


def test_a_workflow_is_its_logins(db: SyncDB, logins: Any) -> None:
    alice, mallory = logins.url("producer", db.url), _login(logins, db, "jobq_producer")
    wf = uuid.uuid4()
    _as(alice, "SELECT jobq.enqueue('step', '{}', workflow_id => $1)", wf)
    with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError, match="another login"):
        _as(mallory, "SELECT jobq.enqueue('step', '{}', workflow_id => $1)", wf)


def test_the_reaper_login_cannot_rewrite_a_payload(db: SyncDB, logins: Any) -> None:
    reaper = logins.url("reaper", db.url)
    jid = db.val("SELECT jobq.enqueue('work', '{\"amount\": 1}')")
    with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
        _as(reaper, "UPDATE jobq.job SET payload = '{\"amount\": 9}' WHERE id = $1", jid)
    _as(reaper, "UPDATE jobq.job SET relay_after = now() WHERE id = $1", jid)  # its columns: yes


def test_retrying_a_dependant_waits_for_its_parent_again(db: SyncDB,
                                                         env: dict[str, str]) -> None:
    """Found by review: `jobq retry` re-ran a dependant a failed parent had
    cancelled at once, without waiting for the parent."""
    parent = db.val("SELECT jobq.enqueue('p', '{}')")
    dep = db.val("SELECT jobq.enqueue('d', '{}', after => $1::uuid[])", [parent])
    settle(db)
    db.execute("UPDATE jobq.job SET status = 'failed', finished_at = now() WHERE id = $1",
               parent)
    settle(db)
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", dep) == "cancelled"
    out = run_cli(env, "retry", str(dep))
    assert out.returncode != 0 and "retry that one first" in out.stderr
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", dep) == "cancelled"
    assert run_cli(env, "retry", str(parent)).returncode == 0
    out = run_cli(env, "retry", str(dep))
    assert out.returncode == 0 and "waits for" in out.stdout, out.stderr
    row = db.fetchrow("SELECT status, waiting_on, relay_after = 'infinity' AS held "
                      "FROM jobq.job WHERE id = $1", dep)
    assert (row["status"], row["waiting_on"], row["held"]) == ("queued", 1, True)
    settle(db)  # armed again; the parent's completion releases it
    db.execute("UPDATE jobq.job SET status = 'completed', finished_at = now() WHERE id = $1",
               parent)
    assert settle(db)["released"] == 1
    assert Q["retry_failed"]  # the statement the CLI runs


def test_a_pause_says_who_paused_the_queue(db: SyncDB, env: dict[str, str]) -> None:
    """Issue #47: a pause from the dashboard was recorded nowhere."""
    set_queue(db, "mail")
    out = run_cli(env, "queue", "pause", "mail")
    assert out.returncode == 0, out.stderr
    row = db.fetchrow("SELECT paused, paused_by, paused_at IS NOT NULL AS since "
                      "FROM jobq.queue WHERE name = 'mail'")
    assert row["paused"] and row["since"] and row["paused_by"]
    assert run_cli(env, "queue", "resume", "mail").returncode == 0
    assert db.val("SELECT paused_by FROM jobq.queue WHERE name = 'mail'") is None
