"""A reaper idle for a while sleeps long between probes (issue #37), yet a
job claimed into that sleep by a consumer that dies at once is requeued
within its lease plus slack (I3): the idle sleep is capped by the shortest
queue lease. And the fast path stays fast: a consumer that goes from idle to
busy wakes the reapers (NOTIFY jobq_busy), so one killed right after an idle
spell is noticed at the busy pace, not an idle sleep later. Here the idle
sleep is 10 s."""

from __future__ import annotations

import signal
import time

import pytest

from harness.helpers import Procs, SyncDB, job, publish, runs, wait_until
from jobq.settings import Settings

pytestmark = pytest.mark.e2e

LEASE_S = 1.0


def test_a_crash_into_an_idle_reapers_sleep_is_found_within_the_lease(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('work', $1) "
               "ON CONFLICT (name) DO UPDATE SET lease_s = $1", LEASE_S)
    reaper = procs.reaper(JOBQ_REAPER__IDLE_SLEEP_S="10")
    reaper.wait_log("reaper ready")
    time.sleep(2)  # setup, not an assertion: past its first sweeps, into an idle sleep
    procs.consumer(JOBQ_CRASH_AT="consumer.after_claim")  # dies right after its claim
    (jid,) = publish(settings, "work", [{"sleep": 0}])
    wait_until(lambda: job(db, jid)["status"] == "active", 15, "the claim", interval=0.01)
    claimed = time.monotonic()
    wait_until(lambda: job(db, jid)["stalls"] + job(db, jid)["suspect_stalls"] >= 1, 15,
               "the requeue", interval=0.01)
    took = time.monotonic() - claimed
    assert took <= LEASE_S + 0.6, f"requeued {took:.2f}s after the claim, lease {LEASE_S}s"


def test_a_worker_killed_right_after_an_idle_spell_is_noticed_at_the_busy_pace(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    grace_s = 0.5
    db.execute("INSERT INTO jobq.queue (name, lease_s, vanished_grace_s) VALUES ('work', 30, $1) "
               "ON CONFLICT (name) DO UPDATE SET lease_s = 30, vanished_grace_s = $1", grace_s)
    reaper = procs.reaper(JOBQ_REAPER__IDLE_SLEEP_S="10")
    reaper.wait_log("reaper ready")
    consumer = procs.consumer()
    consumer.worker_id()
    time.sleep(2)  # setup, not an assertion: the reaper is into an idle sleep
    (jid,) = publish(settings, "work", [{"sleep": 60}])
    wait_until(lambda: runs(db, jid), 15, "the job runs")
    consumer.signal(signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: job(db, jid)["stalls"] + job(db, jid)["suspect_stalls"] >= 1, 15,
               "the requeue", interval=0.01)
    took = time.monotonic() - killed
    # Busy pace (max_sleep_s 0.2 here) + the grace + slack; an idle sleep would be 10 s.
    assert took <= grace_s + 1.5, f"requeued {took:.2f}s after the SIGKILL"
