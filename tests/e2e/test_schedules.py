"""Periodic jobs (issue #17): every slot enqueued exactly once whatever the
number of reapers (one of them frozen meanwhile), and a reaper outage costs
one catch-up run, not one run per missed slot."""

from __future__ import annotations

import signal
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from harness.helpers import Procs, SyncDB, run_cli, wait_until
from harness.scratch import login_url


def _slots(db: SyncDB) -> list[tuple[str, int]]:
    return [(r["key"], r["n"]) for r in db.fetch(
        "SELECT idempotency_key AS key, count(*) AS n FROM jobq.job "
        "WHERE queue = 'ticks' GROUP BY 1 ORDER BY 1")]


def test_three_reapers_one_frozen_enqueue_each_slot_once(
        db: SyncDB, procs: Procs, env: dict[str, str], logins: Any) -> None:
    # An app that declares schedules runs as a consumer that is also a
    # producer: a schedule enqueues jobs (schedule_upsert, issue #28).
    user, password = logins.create(f"cp{uuid.uuid4().hex[:8]}", "jobq_consumer", "jobq_producer")
    consumer = procs.start("consume", "harness.periodic_app:app",  # declares "tick", every 1 s
                           JOBQ_DATABASE_URL=login_url(db.url, user, password))
    consumer.worker_id()
    reapers = [procs.reaper() for _ in range(3)]
    first = wait_until(lambda: db.val("SELECT min(created_at) FROM jobq.job "
                                      "WHERE queue = 'ticks'"), 10, "the first tick")
    reapers[0].signal(signal.SIGSTOP)  # frozen for most of the run
    time.sleep(12)
    reapers[0].signal(signal.SIGCONT)
    time.sleep(8)
    slots = _slots(db)
    print(f"3 reapers, one frozen 12 s: {len(slots)} slots, {sum(n for _, n in slots)} jobs")
    assert all(n == 1 for _, n in slots), [s for s in slots if s[1] > 1]
    span = db.val("SELECT extract(epoch FROM max(created_at) - $1)::float8 FROM jobq.job "
                  "WHERE queue = 'ticks'", first)
    # one job per second of the run (no slot skipped either: the schedule
    # never fell a whole slot behind with two live reapers)
    assert len(slots) >= int(span), (len(slots), span)
    keys = [k for k, _ in slots]
    assert len(set(keys)) == len(keys) and all(k.startswith("schedule:tick:") for k in keys)
    done = wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE queue = 'ticks' "
                                     "AND status = 'completed'") >= len(slots) - 2, 10,
                      "the ticks to run")
    assert done
    listed = run_cli(env, "schedule", "list")
    assert listed.returncode == 0 and "tick" in listed.stdout and "every 1s" in listed.stdout


def test_a_reaper_outage_costs_one_catch_up_run(
        db: SyncDB, procs: Procs, env: dict[str, str]) -> None:
    out = run_cli(env, "schedule", "set", "beat", "work", "--every", "1",
                  "--payload", '{"n": 1}')
    assert out.returncode == 0, out.stderr
    reaper = procs.reaper()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE queue = 'work'") >= 3, 10,
               "three beats")
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(10) == 0
    before = db.val("SELECT count(*) FROM jobq.job WHERE queue = 'work'")
    time.sleep(10)  # no reaper: ten slots pass
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'work'") == before
    t_back = db.val("SELECT now()")
    procs.reaper()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE queue = 'work'") > before + 2,
               10, "the catch-up run and the next beats")
    # Each job names its slot; slots before the reaper came back: the ones
    # run before the outage, plus one catch-up for the ten missed.
    keys = [r["k"] for r in db.fetch(
        "SELECT idempotency_key AS k FROM jobq.job WHERE queue = 'work'")]
    slots = [datetime.strptime(k.split(":", 2)[2], "%Y-%m-%dT%H:%M:%S.%fZ")
             .replace(tzinfo=UTC) for k in keys]
    print(f"outage: {before} jobs before, {sum(1 for t in slots if t < t_back) - before} "
          "for the 10 s without a reaper")
    assert sum(1 for t in slots if t < t_back) == before + 1, (before, sorted(slots), t_back)
    assert db.val("SELECT payload FROM jobq.job WHERE id = (SELECT last_job_id FROM "
                  "jobq.schedule WHERE name = 'beat')") == '{"n": 1}'
    assert run_cli(env, "schedule", "delete", "beat").returncode == 0
    assert db.val("SELECT count(*) FROM jobq.schedule") == 0
