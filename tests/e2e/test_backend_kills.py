"""A database that drops connections under load costs no job a lease wait
(issue #19). A failover, a pooler restart or an idle-connection killer ends
backends mid-statement; before the fix a completion that hit the dying
connection's driver error left its job unowned for a whole lease and
charged it a stall."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, lost_and_duplicates, set_queue, wait_until
from harness.load import kill_backends, produce
from jobq.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_backend_kills_under_load_cost_no_lease_wait_and_no_stall(db: SyncDB, procs: Procs,
                                                                  settings: Settings,
                                                                  db_url: str, report: Any) -> None:
    set_queue(db, "work", lease_s=30)  # a job left to its lease would wait 30 s
    procs.reaper()
    procs.consumer("--concurrency", "16").worker_id()
    ids: list[Any] = []
    producer = threading.Thread(target=produce, args=(settings, 300, 22, ids))
    producer.start()
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") > 100, 15, "load running")
    stop = threading.Event()
    result: list[int] = []
    killer = threading.Thread(target=lambda: result.append(
        kill_backends(db_url, "jobq-consumer%", 0.5, stop, for_s=20)))
    killer.start()
    try:
        producer.join(60)
        wait_until(lambda: lost_and_duplicates(db, ids)[0] == 0, 90, "every job completed",
                   interval=0.2)
    finally:
        stop.set()
        killer.join(30)
    kills = result[0] if result else 0
    assert kills >= 20, f"the test killed only {kills} backends"
    lost, dups = lost_and_duplicates(db, ids)
    assert lost == 0 and len(ids) > 3000
    row = db.fetchrow(
        "SELECT coalesce(sum(stalls + suspect_stalls), 0) AS charged, max(attempts) AS attempts,"
        " max(extract(epoch FROM finished_at - started_at)) AS slowest FROM jobq.job "
        "WHERE id = ANY($1)", ids)
    assert row["charged"] == 0, "a stall or suspect mark was charged for jobq's own errors"
    assert row["slowest"] < 5, f"a job waited {row['slowest']:.1f} s from claim to completion"
    assert row["attempts"] == 1 and dups == 0, "a job ran twice"
    report(f"consumer backends killed x{kills} over 20 s (2/s) at 300 jobs/s", len(ids), lost,
           dups)
