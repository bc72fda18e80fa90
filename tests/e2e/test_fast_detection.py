"""Knowing a worker died in seconds, not a lease later, without blaming the
innocent (issue #6). Leases here are long (30 s) on purpose: detection must
come from the ended database session, not from the lease."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, job, publish, runs, set_queue, wait_until
from jobq.settings import Settings

pytestmark = pytest.mark.e2e

LONG_LEASE_S = 30.0


# Kill -> every job running again with a 30 s lease is measured the hard way
# (every run 5 s, 8 and 32 jobs) in test_parallel_recovery.py.


def test_a_live_worker_that_loses_its_session_is_not_blamed(db: SyncDB, procs: Procs,
                                                            settings: Settings) -> None:
    set_queue(db, "work", lease_s=LONG_LEASE_S, vanished_grace_s=2)
    reaper = procs.reaper()
    a = procs.consumer()
    a_id = a.worker_id()
    (jid,) = publish(settings, "work", [{"sleep": 6}])
    wait_until(lambda: runs(db, jid), 10, "the job runs in A")
    # A's registry session ends (a network blip, an admin, a failover) while A
    # is paused, so the reaper surely sees it and cuts A's lease to the grace.
    a.signal(signal.SIGSTOP)
    killed = db.val("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'jobq-consumer-registry' "
                    "AND datname = current_database()")
    assert killed == 1
    reaper.wait_log(rf"worker {a_id} vanished .*1 lease\(s\) cut", 5)
    a.signal(signal.SIGCONT)  # A is alive: it re-registers and renews within the grace
    a.wait_log("worker registry session ended; re-registering")
    time.sleep(3)  # past the 2 s the lease was cut to
    wait_until(lambda: job(db, jid)["status"] == "completed", 10, "A completes it")
    row = job(db, jid)
    assert row["worker_id"] == a_id and row["stalls"] == 0 and row["suspect_stalls"] == 0
    assert len(runs(db, jid)) == 1 and runs(db, jid)[0]["outcome"] == "returned"
    assert "worker_vanished" in [r["event"] for r in db.fetch(
        "SELECT event FROM jobq.history WHERE job_id = $1", jid)]
    assert db.val("SELECT vanished_at FROM jobq.worker WHERE worker_id = $1", a_id) is None


def test_sigstop_falls_back_to_the_lease(db: SyncDB, procs: Procs, settings: Settings,
                                         report: Any) -> None:
    lease_s = 2.0
    set_queue(db, "work", lease_s=lease_s, vanished_grace_s=2)
    procs.reaper()
    a = procs.consumer()
    a.worker_id()
    (jid,) = publish(settings, "work", [{"sleep_first": 60}])
    wait_until(lambda: runs(db, jid), 10, "the job runs")
    a.signal(signal.SIGSTOP)  # its session stays open: no fast path
    stopped = time.monotonic()
    wait_until(lambda: job(db, jid)["suspect_stalls"] + job(db, jid)["stalls"] == 1, 5,
               "requeue", interval=0.01)
    latency = time.monotonic() - stopped
    assert latency <= lease_s + 1
    a.signal(signal.SIGCONT)
    lost = int(job(db, jid)["status"] not in ("queued", "active", "completed"))
    report(f"SIGSTOP, {lease_s:.0f} s lease (lease fallback)", 1, lost, len(runs(db, jid)) - 1,
           [latency])
