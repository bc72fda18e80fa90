"""Schedules' policies (issue #51, item 8): overlap skip never puts a second
job of a schedule in line while one is queued or running, and keeps the
slots it skipped; ``jobq schedule trigger`` makes exactly one job now;
``jobq schedule backfill`` makes the missing slots' jobs, each once, however
often it is run. Reapers fire through their real store (PgReaperStore);
slots are made due by moving ``next_run_at`` to the database's now."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from harness.helpers import SyncDB, run_cli, set_queue
from harness.helpers import with_pool as run
from jobq import App
from jobq.amqp.broker import Broker
from jobq.errors import BadInput
from jobq.ops import schedule_admin as admin
from jobq.reaper import Reaper
from jobq.reaper.store import PgReaperStore
from jobq.rows import Probe
from jobq.schedules import Schedule
from jobq.settings import Settings
from jobq.worker.store import declare_schedules
from tests.integration.test_cli import one_line_error

FIRE = Probe(False, False, False, False, True, None)


def _reaper(settings: Settings, pool: asyncpg.Pool) -> Reaper:
    return Reaper(settings, PgReaperStore(pool, Broker("", "unused")))


async def _due(pool: asyncpg.Pool, name: str) -> None:
    await pool.execute("UPDATE jobq.schedule SET next_run_at = now() WHERE name = $1", name)


async def _jobs(pool: asyncpg.Pool, queue: str) -> list[Any]:
    return await pool.fetch("SELECT id, status FROM jobq.job WHERE queue = $1 "
                            "ORDER BY created_at", queue)


def test_overlap_skip_enqueues_nothing_while_the_last_job_lives_and_records_the_slot(
        settings: Settings, db: SyncDB) -> None:
    set_queue(db, "nightly")

    async def body(pool: asyncpg.Pool) -> None:
        await admin.set_schedule(pool, Schedule("night", "nightly", {"n": 1}, every_s=3600,
                                                overlap="skip"))
        reaper = _reaper(settings, pool)
        await _due(pool, "night")
        await reaper.run_once(FIRE)
        (first,) = await _jobs(pool, "nightly")
        # Queued, then running: each due slot is skipped and kept.
        skipped = []
        for status in ("queued", "active"):
            await pool.execute("UPDATE jobq.job SET status = $2 WHERE id = $1", first["id"],
                               status)
            await _due(pool, "night")
            skipped.append(await pool.fetchval("SELECT next_run_at FROM jobq.schedule "
                                               "WHERE name = 'night'"))
            await reaper.run_once(FIRE)
            assert len(await _jobs(pool, "nightly")) == 1
        row = await pool.fetchrow("SELECT skipped_total, skipped_slots, last_job_id, "
                                  "next_run_at > now() AS ahead FROM jobq.schedule")
        assert row is not None
        assert row["skipped_total"] == 2 and row["skipped_slots"] == skipped, dict(row)
        assert row["last_job_id"] == first["id"] and row["ahead"]
        # Ended: the next slot enqueues again.
        await pool.execute("UPDATE jobq.job SET status = 'failed' WHERE id = $1", first["id"])
        await _due(pool, "night")
        await reaper.run_once(FIRE)
        jobs = await _jobs(pool, "nightly")
        assert len(jobs) == 2 and jobs[1]["status"] == "queued"
        # 'allow' (the default) enqueues beside a live job.
        await admin.set_schedule(pool, Schedule("night", "nightly", {"n": 1}, every_s=3600))
        await _due(pool, "night")
        await reaper.run_once(FIRE)
        assert len(await _jobs(pool, "nightly")) == 3

    run(settings.database_url, body)


def test_racing_reapers_and_triggers_never_put_two_jobs_of_a_skip_schedule_in_line(
        settings: Settings, db: SyncDB) -> None:
    set_queue(db, "racing")

    async def body(pool: asyncpg.Pool) -> None:
        await admin.set_schedule(pool, Schedule("race", "racing", None, every_s=60,
                                                overlap="skip"))
        reapers = [_reaper(settings, pool) for _ in range(3)]

        async def trigger() -> None:
            try:
                await admin.trigger_schedule(pool, "race")
            except BadInput:
                pass  # refused: a job of it is live

        for i in range(12):
            await _due(pool, "race")
            racers = [trigger(), *(r.run_once(FIRE) for r in reapers)]
            await asyncio.gather(*(racers if i % 2 else racers[::-1]))
            live = [j for j in await _jobs(pool, "racing") if j["status"] == "queued"]
            assert len(live) == 1, (i, live)
            if i % 3 == 2:  # it ended: the next round may enqueue again
                await pool.execute("UPDATE jobq.job SET status = 'completed' WHERE id = $1",
                                   live[0]["id"])

    run(settings.database_url, body)


def test_trigger_makes_one_job_now_and_refuses_under_skip_while_one_lives(
        settings: Settings, env: dict[str, str], db: SyncDB) -> None:
    set_queue(db, "reports")
    assert run_cli(env, "schedule", "set", "daily", "reports", "--cron", "0 3 * * *",
                   "--payload", '{"k": 1}').returncode == 0
    before = db.val("SELECT next_run_at FROM jobq.schedule WHERE name = 'daily'")
    out = run_cli(env, "schedule", "trigger", "daily")
    assert out.returncode == 0, out.stderr
    (job,) = db.fetch("SELECT id, payload->>'k' AS k FROM jobq.job WHERE queue = 'reports'")
    assert out.stdout.strip() == str(job["id"]) and job["k"] == "1", out.stdout
    assert db.val("SELECT next_run_at FROM jobq.schedule WHERE name = 'daily'") == before
    assert run_cli(env, "schedule", "trigger", "daily").returncode == 0  # allow: another
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'reports'") == 2
    # skip: refused while the last one is queued, named in one line
    assert run_cli(env, "schedule", "set", "daily", "reports", "--cron", "0 3 * * *",
                   "--overlap", "skip").returncode == 0
    last = db.val("SELECT last_job_id FROM jobq.schedule WHERE name = 'daily'")
    one_line_error(run_cli(env, "schedule", "trigger", "daily"), 1, "overlap skip", str(last))
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'reports'") == 2
    # setting the schedule again without --overlap keeps it
    assert run_cli(env, "schedule", "set", "daily", "reports", "--cron", "0 4 * * *"
                   ).returncode == 0
    assert db.val("SELECT overlap FROM jobq.schedule WHERE name = 'daily'") == "skip"
    listed = run_cli(env, "schedule", "list")
    assert "skip" in listed.stdout, listed.stdout
    one_line_error(run_cli(env, "schedule", "trigger", "nope"), 1, "no schedule named")
    bad = run_cli(env, "schedule", "set", "daily", "reports", "--every", "60", "--overlap", "x")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_backfill_run_twice_makes_each_missing_slot_once(
        settings: Settings, env: dict[str, str], db: SyncDB) -> None:
    set_queue(db, "hourly")
    assert run_cli(env, "schedule", "set", "hour", "hourly", "--cron", "0 * * * *"
                   ).returncode == 0
    now = db.val("SELECT date_trunc('hour', now())")
    start, end = now - timedelta(hours=5), now - timedelta(hours=1)
    # The reaper fired one of those slots itself, as a catch-up would.
    fired = start + timedelta(hours=2)
    db.execute("UPDATE jobq.schedule SET next_run_at = $1 WHERE name = 'hour'", fired)

    async def fire(pool: asyncpg.Pool) -> None:
        await _reaper(settings, pool).run_once(FIRE)

    run(settings.database_url, fire)
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'hourly'") == 1
    iso = ("--from", start.isoformat(), "--to", end.isoformat())
    first = run_cli(env, "schedule", "backfill", "hour", *iso)
    assert first.returncode == 0, first.stderr
    keys = [r["idempotency_key"] for r in db.fetch(
        "SELECT idempotency_key FROM jobq.job WHERE queue = 'hourly' ORDER BY idempotency_key")]
    assert len(keys) == 5 and len(set(keys)) == 5, keys  # 5 slots, one job each
    again = run_cli(env, "schedule", "backfill", "hour", *iso)
    assert again.returncode == 0 and "none missing" in again.stdout, again.stdout
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'hourly'") == 5
    for args, needle in ((("--from", "2026-01-01T00:00", "--to", end.isoformat()), "time zone"),
                         (("--from", "yesterday", "--to", end.isoformat()), "not a time"),
                         (("--from", end.isoformat(), "--to", start.isoformat()), "before"),
                         (("--from", start.isoformat(),
                           "--to", (now + timedelta(days=1)).isoformat()), "future"),
                         (("--from", "2000-01-01T00:00Z", "--to", end.isoformat()),
                          "more than 10000 slots")):
        one_line_error(run_cli(env, "schedule", "backfill", "hour", *args), 1, needle)
    one_line_error(run_cli(env, "schedule", "backfill", "nope", *iso), 1, "no schedule named")


def test_an_app_declares_its_overlap(settings: Settings, db: SyncDB) -> None:
    app = App()

    @app.periodic(every=60, overlap="skip")
    @app.handler("swept")
    async def sweep(job: Any) -> None:
        pass

    with pytest.raises(Exception, match="unknown overlap"):
        app.schedule("x", "swept", every=60, overlap="sometimes")

    async def body(pool: asyncpg.Pool) -> None:
        async with pool.acquire() as conn:
            assert await declare_schedules(conn, list(app.schedules.values())) == 1

    run(settings.database_url, body)
    assert db.val("SELECT overlap FROM jobq.schedule WHERE name = 'swept'") == "skip"
