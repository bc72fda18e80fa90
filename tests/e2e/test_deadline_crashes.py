"""Deadlines through a SIGKILL (issue #51, item 7; schema 0031): a consumer
killed while it runs two jobs and holds more in its prefetch; the deadlines
pass before anyone takes over. The two it had started run again and
complete (a deadline is about starting); every other job is cancelled as
expired by the reapers and never ran. Nothing is lost, nothing unstarted
runs past its deadline. Real processes, database timestamps."""

from __future__ import annotations

import signal

import pytest

from harness.helpers import Procs, SyncDB, publish_jobs, set_queue, wait_until
from jobq.newjob import NewJob
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def test_a_killed_consumers_unstarted_jobs_expire_and_its_started_ones_finish(
        settings: Settings, db: SyncDB, procs: Procs) -> None:
    set_queue(db, "work", lease_s=1)
    first = procs.consumer("--queue", "work", "--concurrency", "2")
    first.worker_id()
    ids = publish_jobs(settings, [NewJob("work", {"sleep": 1.0}, expires_in_s=4)
                                  for _ in range(10)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") >= 2, 15, "two handlers running")
    first.signal(signal.SIGKILL)
    started = {r["job_id"] for r in db.fetch("SELECT job_id FROM test_run")}
    wait_until(lambda: db.val("SELECT bool_and(expires_at < now()) FROM jobq.job "
                              "WHERE id = ANY($1::uuid[])", ids), 15, "every deadline past")
    procs.reaper()
    procs.consumer("--queue", "work", "--concurrency", "4")
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1::uuid[]) AND "
                              "status IN ('completed', 'cancelled')", ids) == len(ids),
               30, "every job ended")
    rows = db.fetch("SELECT j.id, j.status, j.last_error, j.expires_at, "
                    "(SELECT min(r.started_at) FROM test_run r WHERE r.job_id = j.id) AS ran "
                    "FROM jobq.job j WHERE j.id = ANY($1::uuid[])", ids)
    for r in rows:
        if r["id"] in started:  # started before its deadline: runs again to the end
            assert r["status"] == "completed", dict(r)
        else:
            assert r["status"] == "cancelled" and r["last_error"].startswith("expired"), dict(r)
            assert r["ran"] is None, dict(r)  # never ran
        assert r["ran"] is None or r["ran"] <= r["expires_at"], dict(r)
    assert len(started) >= 2 and sum(r["status"] == "cancelled" for r in rows) >= 1
