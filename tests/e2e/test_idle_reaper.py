"""A reaper idle for a while sleeps long between probes (issue #37), yet a
job claimed into that sleep by a consumer that dies at once is requeued
within its lease plus slack (I3): the idle sleep is capped by the shortest
queue lease. Here the idle sleep is 10 s and the lease 1 s."""

from __future__ import annotations

import time

import pytest

from harness.helpers import Procs, SyncDB, job, publish, wait_until
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
