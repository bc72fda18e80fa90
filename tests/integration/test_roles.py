"""Least privilege (issue #14): what each group role may do, read from the
database's own catalogs and tried as a real login of that role.

The e2e suite already runs every subprocess as its own role (harness/
helpers.py picks the login by verb); these tests pin the grants themselves
and the refusals."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, publish, run_cli, set_queue
from harness.scratch import login_url
from jobq.sql import GENERIC_PLAN, GRANTS

# Every right a jobq group role holds in schema jobq, as (role, object, right).
# A migration that adds a table, view or function must say here who gets it.
TABLE_RIGHTS = {
    ("jobq_producer", "queue", "SELECT"),
    ("jobq_consumer", "queue", "SELECT"),
    *{("jobq_reaper", "job", r) for r in ("SELECT", "DELETE")},  # UPDATE: some columns
    *{("jobq_reaper", "job_event", r) for r in ("SELECT", "INSERT", "DELETE")},
    *{("jobq_reaper", "worker", r) for r in ("SELECT", "UPDATE", "DELETE")},
    *{("jobq_reaper", "reaper", r) for r in ("SELECT", "INSERT", "UPDATE", "DELETE")},
    ("jobq_reaper", "queue", "SELECT"),
    ("jobq_reaper", "key_rate", "SELECT"),  # per-key rate buckets (0013)
    ("jobq_reaper", "key_rate", "DELETE"),
    ("jobq_reaper", "key_lock", "SELECT"),  # per-key claim locks (0024): pruned, never locked
    ("jobq_reaper", "key_lock", "DELETE"),
    ("jobq_reaper", "overdue", "SELECT"),
    ("jobq_reaper", "schedule", "SELECT"),  # periodic jobs (0007)
    ("jobq_reaper", "schedule", "UPDATE"),
    # OpenTelemetry context: written by the enqueue functions only (0024), not the producer
    ("jobq_reaper", "job_dependency", "SELECT"),  # its probe (0024)
    ("jobq_consumer", "job_trace", "SELECT"),
    ("jobq_reaper", "job_signal", "SELECT"),  # its wake duty (0028)
    ("jobq_reaper", "job_signal", "UPDATE"),
    ("jobq_reaper", "backlog", "SELECT"),  # its backlog gauges (0030)
    ("jobq_reaper", "job_unique", "SELECT"),  # retention forgets ended holds (0032)
    ("jobq_reaper", "job_unique", "DELETE"),
    ("jobq_reaper", "key_limit", "SELECT"),  # its unpark reads key tiers (0036)
    ("jobq_reaper", "latest_key", "SELECT"),  # its supersede duty (0042): takes rows
    ("jobq_reaper", "latest_key", "UPDATE"),  # FOR UPDATE SKIP LOCKED, deletes them
    ("jobq_reaper", "latest_key", "DELETE"),
}
FUNCTION_RIGHTS = {("jobq_producer", "enqueue"), ("jobq_producer", "enqueue_many"),
                   ("jobq_reaper", "enqueue"), ("jobq_reaper", "rate_tokens"),
                   ("jobq_reaper", "settle_dependants"),
                   ("jobq_reaper", "key_tokens"), ("jobq_reaper", "key_allowance"),
                   ("jobq_reaper", "key_tier"), ("jobq_reaper", "aged"),
                   ("jobq_reaper", "allowance"),
                   ("jobq_producer", "signal"), ("jobq_reaper", "signal")} | {
    (role, f"q_{name}") for name, roles in GRANTS.items() for role in roles}
REAPER_JOB_COLUMNS = {"status", "lock", "lease_expires_at", "stalls", "suspect_stalls",
                      "suspect", "isolated", "last_error", "finished_at", "run_at",
                      "relay_after", "published_at", "wake_on", "joining"}
GROUPS = ("jobq_producer", "jobq_consumer", "jobq_reaper", "jobq_reader")


def test_grants_are_exactly_the_list(db: SyncDB) -> None:
    rows = db.fetch("""
        SELECT r.rolname AS role, c.relname AS name, a.privilege_type AS right_, c.relkind
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        CROSS JOIN LATERAL aclexplode(c.relacl) a
        JOIN pg_roles r ON r.oid = a.grantee
        WHERE n.nspname = 'jobq' AND r.rolname = ANY($1::text[])""", list(GROUPS))
    reader = {(r["role"], r["name"], r["right_"]) for r in rows if r["role"] == "jobq_reader"}
    others = {(r["role"], r["name"], r["right_"]) for r in rows if r["role"] != "jobq_reader"}
    assert others == TABLE_RIGHTS
    # The reaper may update only the columns its statements move (0024): not a payload.
    columns = {r["attname"] for r in db.fetch("""
        SELECT a.attname FROM pg_attribute a
        CROSS JOIN LATERAL aclexplode(a.attacl) x
        WHERE a.attrelid = 'jobq.job'::regclass AND x.privilege_type = 'UPDATE'
          AND x.grantee = 'jobq_reaper'::regrole""")}
    assert columns == REAPER_JOB_COLUMNS
    relations = {r["relname"] for r in db.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = 'jobq'::regnamespace "
        "AND relkind IN ('r', 'v')")}
    assert reader == {("jobq_reader", name, "SELECT") for name in relations}

    fns = db.fetch("""
        SELECT p.proname, p.prosecdef, p.proconfig, p.proowner::regrole::text AS owner,
               coalesce(array_agg(r.rolname) FILTER (WHERE a.privilege_type = 'EXECUTE'),
                        '{}') AS grantees,
               bool_or(a.grantee = 0) AS public, p.proacl IS NULL AS default_acl
        FROM pg_proc p
        LEFT JOIN LATERAL aclexplode(p.proacl) a ON true
        LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE p.pronamespace = 'jobq'::regnamespace
        GROUP BY 1, 2, 3, 4, p.proacl""")
    got = {(g, f["proname"]) for f in fns for g in f["grantees"] if g in GROUPS}
    assert got == FUNCTION_RIGHTS
    # Nothing database-wide (issue #33): 0006's default privilege outlived DROP SCHEMA.
    assert db.val("SELECT count(*) FROM pg_default_acl WHERE defaclnamespace = 0 "
                  "AND defaclrole = 'jobq_owner'::regrole") == 0
    for f in fns:
        assert not f["public"] and not f["default_acl"], f"{f['proname']} is PUBLIC"
        assert f["owner"] == "jobq_owner", f["proname"]
        if f["prosecdef"]:  # the per-job statements keep one plan (routines.py, schema 0044)
            plan = (["plan_cache_mode=force_generic_plan", "enable_seqscan=off"]
                    if f["proname"] in {f"q_{n}" for n in GENERIC_PLAN} | {"enqueue_many"}
                    else ["plan_cache_mode=force_custom_plan"])
            assert f["proconfig"] == ["search_path=pg_catalog, pg_temp", *plan], f["proname"]
    owners = {r["owner"] for r in db.fetch(
        "SELECT relowner::regrole::text AS owner FROM pg_class "
        "WHERE relnamespace = 'jobq'::regnamespace")}
    assert owners == {"jobq_owner"}


def _as(url: str, sql: str, *args: Any) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def _denied(url: str, sql: str, *args: Any) -> None:
    with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
        _as(url, sql, *args)


def test_a_producer_enqueues_but_reads_and_changes_nothing(db: SyncDB, logins: Any) -> None:
    url = logins.url("producer", db.url)
    other = db.val("SELECT jobq.enqueue('secrets', '{\"card\": \"4111\"}')")
    (row,) = _as(url, "SELECT jobq.enqueue('mine', '{\"n\": 1}') AS id")
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", row["id"]) == "queued"
    _denied(url, "SELECT payload FROM jobq.job WHERE id = $1", other)
    _denied(url, "SELECT * FROM jobq.queue_stats")
    _denied(url, "UPDATE jobq.job SET status = 'completed' WHERE id = $1", other)
    _denied(url, "DELETE FROM jobq.job_event")
    _denied(url, "SELECT * FROM jobq.q_claim($1, 'w', '{secrets}', $2)", [other], [uuid.uuid4()])
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", other) == "queued"


def test_a_consumer_changes_only_the_jobs_it_holds(db: SyncDB, logins: Any) -> None:
    url = logins.url("consumer", db.url)
    theirs, mine = (db.val("SELECT jobq.enqueue('q', '{}')") for _ in range(2))
    their_lock = db.val("""UPDATE jobq.job SET status = 'active', lock = gen_random_uuid(),
                           lease_expires_at = now() + interval '1 minute', worker_id = 'other'
                           WHERE id = $1 RETURNING lock""", theirs)
    _denied(url, "UPDATE jobq.job SET status = 'completed' WHERE id = $1", theirs)
    _denied(url, "SELECT lock FROM jobq.job WHERE id = $1", theirs)
    _denied(url, "INSERT INTO jobq.job_event (job_id, event) VALUES ($1, 'completed')", theirs)
    # Through the fenced functions, a guessed token matches nothing.
    assert _as(url, "SELECT * FROM jobq.q_complete($1, $2, $3)",
               [theirs], [uuid.uuid4()], ['"forged"']) == []
    assert _as(url, "SELECT * FROM jobq.q_release($1, $2, $3, $4)",
               [theirs], [uuid.uuid4()], "x", False) == []
    assert _as(url, "SELECT * FROM jobq.q_progress($1, $2, $3)", theirs, uuid.uuid4(),
               "99") == []
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", theirs) == "active"
    assert db.val("SELECT lock FROM jobq.job WHERE id = $1", theirs) == their_lock
    # Its own: claimed with its token, completed with it.
    token = uuid.uuid4()
    (claimed,) = _as(url, "SELECT * FROM jobq.q_claim($1, 'me', '{q}', $2)", [mine], [token])
    assert claimed["lock"] == token
    assert [r["id"] for r in _as(url, "SELECT * FROM jobq.q_complete($1, $2, $3)",
                                 [mine], [token], ['{"ok": 1}'])] == [mine]
    assert db.val("SELECT result FROM jobq.job WHERE id = $1", mine) == '{"ok": 1}'
    _denied(url, "SELECT jobq.enqueue('q', '{}')")  # not without jobq_producer


def test_the_reader_reads_everything_and_writes_nothing(db: SyncDB, logins: Any) -> None:
    url = logins.url("reader", db.url)
    jid = db.val("SELECT jobq.enqueue('q', '{\"a\": 1}')")
    assert _as(url, "SELECT payload FROM jobq.job WHERE id = $1", jid)
    for view in ("queue_stats", "backlog", "stalled", "running", "failed", "history", "workers",
                 "reaper_status", "overdue"):
        _as(url, f"SELECT * FROM jobq.{view} LIMIT 1")
    _denied(url, "UPDATE jobq.job SET status = 'failed' WHERE id = $1", jid)
    _denied(url, "DELETE FROM jobq.job WHERE id = $1", jid)
    _denied(url, "UPDATE jobq.queue SET lease_s = 1")
    _denied(url, "SELECT jobq.enqueue('q', '{}')")
    _denied(url, "SELECT * FROM jobq.q_quarantine($1, 'w', ARRAY['q'], $1)", jid)


def test_the_cli_read_verbs_work_for_the_reader(env: dict[str, str], db: SyncDB,
                                               logins: Any) -> None:
    jid = db.val("SELECT jobq.enqueue('q', '{\"a\": 1}')")
    as_reader = {**env, "JOBQ_DATABASE_URL": logins.url("reader", db.url)}
    for args in (["stats"], ["inspect", str(jid)], ["queue", "list"]):
        out = run_cli(as_reader, *args)
        assert out.returncode == 0, (args, out.stderr)
    refused = run_cli(as_reader, "cancel", str(jid))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "permission denied" in refused.stderr and "jobq_" in refused.stderr


def test_a_login_without_its_role_gets_one_line_and_exit_2(
        env: dict[str, str], db: SyncDB, logins: Any) -> None:
    bare = logins.create("bare")  # LOGIN, member of no jobq role
    e = {**env, "JOBQ_DATABASE_URL": login_url(db.url, *bare)}
    for args in (["consume", "harness.apps:app", "--queue", "work"], ["reap"],
                 ["publish", "q", "{}"], ["stats"]):
        out = run_cli(e, *args, timeout=30)
        lines = [ln for ln in out.stderr.strip().splitlines() if "Traceback" not in ln]
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr, (args, out.stderr)
        error = [ln for ln in lines if "error" in ln.lower() or "permission" in ln]
        assert error and "permission denied" in error[-1] and bare[0] in error[-1], (args, lines)


def test_a_consumer_missing_one_grant_stops_instead_of_looping(
        env: dict[str, str], db: SyncDB, logins: Any, settings: Any) -> None:
    """The issue's case: a right missing on the claim path used to loop
    "cannot claim ... requeued" forever with /readyz green."""
    db.execute("REVOKE EXECUTE ON FUNCTION jobq.q_claim FROM jobq_consumer")
    publish(settings, "work", [{}])
    e = {**env, "JOBQ_DATABASE_URL": logins.url("consumer", db.url)}
    out = run_cli(e, "consume", "harness.apps:app", "--queue", "work", timeout=40)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "permission denied for function q_claim" in out.stderr
    assert "jobq_consumer" in out.stderr
    assert db.val("SELECT count(*) FROM jobq.job WHERE status = 'queued'") == 1  # nothing lost


def test_migrate_on_an_up_to_date_schema_needs_no_create_right(
        env: dict[str, str], db: SyncDB, logins: Any) -> None:
    migrator = logins.create("migrator")
    db.execute(f"GRANT jobq_owner TO {migrator[0]}")
    db.execute(f"REVOKE CREATE ON DATABASE {db.val('SELECT current_database()')} FROM PUBLIC")
    out = run_cli({**env, "JOBQ_DATABASE_URL": login_url(db.url, *migrator)}, "migrate")
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout


@pytest.mark.parametrize("statement", ["q_worker_register", "q_renew", "q_complete"])
def test_a_consumer_missing_a_right_anywhere_exits_2_and_loses_nothing(
        env: dict[str, str], db: SyncDB, logins: Any, settings: Any, statement: str) -> None:
    """Registry, heartbeat and completer meet a missing right as intake does:
    one line, drain, exit 2 (they used to retry forever)."""
    db.execute(f"REVOKE EXECUTE ON FUNCTION jobq.{statement} FROM jobq_consumer")
    set_queue(db, "work", lease_s=2)  # renewed after ~0.7 s, while the job runs
    (jid,) = publish(settings, "work", [{"sleep": 1.5}])
    e = {**env, "JOBQ_DATABASE_URL": logins.url("consumer", db.url),
         "JOBQ_CONSUMER__SHUTDOWN_GRACE_S": "1"}
    out = run_cli(e, "consume", "harness.apps:app", "--queue", "work", timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("jobq: error: permission denied for function") and \
        statement in last and "grant it jobq_consumer" in last, last
    # nothing lost: finished in the drain, or released, or left to its lease
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", jid) in (
        "queued", "active", "completed")


def test_readyz_says_why_while_a_consumer_stops_for_a_missing_right(
        env: dict[str, str], db: SyncDB, logins: Any, settings: Any, tmp_path: Any) -> None:
    import json

    from harness.helpers import Procs, free_port, http, wait_until

    db.execute("REVOKE EXECUTE ON FUNCTION jobq.q_complete FROM jobq_consumer")
    port = free_port()
    procs = Procs({**env, "JOBQ_DATABASE_URL": logins.url("consumer", db.url),
                   "JOBQ_HEALTH_PORT": str(port), "JOBQ_CONSUMER__SHUTDOWN_GRACE_S": "4"},
                  tmp_path)
    try:
        c = procs.consumer("--queue", "work")
        c.worker_id()
        publish(settings, "work", [{}])  # its completion meets the missing right

        def problem() -> Any:
            try:
                status, body = http(f"http://127.0.0.1:{port}/readyz", timeout=1)
            except OSError:
                return None
            return json.loads(body).get("problem") if status == 503 else None

        why = wait_until(problem, 15, "/readyz to say why it is stopping")
        assert "permission denied for function q_complete" in why and "jobq_consumer" in why
        assert c.wait(20) == 2
    finally:
        procs.close()


def test_two_installs_on_one_cluster_have_rights_of_their_own(pg_admin_url: str) -> None:
    """Issue #47 M7: roles are cluster-wide, and team A's logins read,
    changed, enqueued into, claimed from and altered team B's separate
    database. Each install now has group roles of its own (JOBQ_ROLE_PREFIX),
    and a login of one can do nothing in the other's database."""
    from harness.scratch import admin, with_db
    from jobq import roles
    from jobq.errors import ConfigError
    from jobq.ops import migrate

    tag = uuid.uuid4().hex[:6]
    a, b = f"ta{tag}", f"tb{tag}"
    dbs = {a: f"jobq_a_{tag}", b: f"jobq_b_{tag}"}
    alice, password = f"alice_{tag}", uuid.uuid4().hex

    async def go() -> None:
        for prefix, name in dbs.items():
            await admin(pg_admin_url, f"CREATE DATABASE {name}")
            conn = await asyncpg.connect(with_db(pg_admin_url, name))
            try:
                await migrate.apply(conn, prefix)
                assert await migrate.shared_with(conn, prefix) == []
            finally:
                await conn.close()
        await admin(pg_admin_url, f"CREATE ROLE {alice} LOGIN PASSWORD '{password}' IN ROLE "
                    f"{a}_producer, {a}_consumer, {a}_reader")
        mine = await asyncpg.connect(login_url(with_db(pg_admin_url, dbs[a]), alice, password))
        theirs = await asyncpg.connect(login_url(with_db(pg_admin_url, dbs[b]), alice, password))
        try:
            jid = await mine.fetchval("SELECT jobq.enqueue('work', '{}')")
            assert await mine.fetchval("SELECT count(*) FROM jobq.job") == 1
            for sql in ("SELECT jobq.enqueue('work', '{}')",
                        "SELECT count(*) FROM jobq.job",
                        "SELECT * FROM jobq.q_claim(ARRAY[gen_random_uuid()], 'w', '{work}', "
                        "ARRAY[gen_random_uuid()])",
                        "ALTER TABLE jobq.job ADD COLUMN x int"):
                with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
                    await theirs.execute(sql)
            assert jid is not None
            # a migrate of B with A's roles is refused with the fix
            conn = await asyncpg.connect(with_db(pg_admin_url, dbs[b]))
            try:
                with pytest.raises(ConfigError, match=f"JOBQ_ROLE_PREFIX={b}"):
                    await migrate.apply(conn, a)
            finally:
                await conn.close()
        finally:
            await mine.close()
            await theirs.close()

    async def clean() -> None:
        for name in dbs.values():
            await admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin(pg_admin_url, f"DROP ROLE IF EXISTS {alice}",
                    *(f"DROP ROLE IF EXISTS {r}" for p in dbs for r in roles.names(p)))

    try:
        asyncio.run(go())
    finally:
        asyncio.run(clean())


def test_migrate_says_when_the_default_roles_reach_other_databases(
        db_url: str, env: dict[str, str]) -> None:
    """The test databases of this run all use the jobq_* roles: a migrate
    says so, and how to give an install roles of its own."""
    out = run_cli(env, "migrate")
    assert out.returncode == 0, out.stderr
    assert "JOBQ_ROLE_PREFIX" in out.stderr and "reaches those too" in out.stderr


def test_every_sweep_duty_runs_as_the_reaper_login(settings: Any, db: SyncDB,
                                                    logins: Any) -> None:
    """Each duty's statement, run by the real reaper as a jobq_reaper login
    (the grants above are a list; this is whether they suffice). The
    supersede duty's first version locked jobq.latest_key rows without the
    UPDATE right FOR UPDATE needs: 'permission denied' every sweep, seen
    only here (its tests ran the reaper as the admin login)."""
    from jobq.reaper.service import Reaper

    set_queue(db, "lt", key_policy="latest")
    older = db.val("SELECT jobq.enqueue('lt', '{}', key => 'k', delay_s => 60)")
    db.val("SELECT jobq.enqueue('lt', '{}', key => 'k')")
    as_reaper = settings.model_copy(update={"database_url": logins.url("reaper", db.url)})

    async def go() -> Any:
        reaper = Reaper(as_reaper)
        await reaper.connect(wait=False)
        try:
            return await reaper.run_once(None)  # every duty, whatever the probe says
        finally:
            await reaper.close()

    sweep = asyncio.run(go())
    assert sweep.errors == {}, sweep.errors
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", older) == "cancelled"
