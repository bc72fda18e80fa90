"""Detection figures (issue #6), with a 30 s lease and default settings:

- SIGKILL of a consumer holding jobs -> jobs requeued / running again
  (fast path: the worker's database session ends, the reaper cuts its leases
  to vanished_grace_s = 2 s); target p99 <= 3 s.
- SIGSTOP of a consumer -> jobs requeued (no fast path: the session stays
  open; the lease decides); target <= lease + 1 s.
- one poison job crashing a consumer with concurrency 8 that holds 7 healthy
  jobs: the 7 complete, the poison fails alone after max_stalls.

    .venv/bin/python bench/detection.py --kills 20 --stops 20
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchenv import world
from tests.helpers import Procs, SyncDB, publish, set_queue, wait_until

from jobq.settings import Settings


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_s": round(statistics.median(values), 2),
            "p99_s": round(pct(values, 0.99), 2), "max_s": round(max(values), 2)}


def kills(db: SyncDB, procs: Procs, settings: Settings, trials: int) -> dict[str, Any]:
    """Each trial: consumer A takes 4 jobs, an idle consumer B stands by, A is
    SIGKILLed; measure until the 4 are requeued, claimed again, running again."""
    set_queue(db, "work", lease_s=30, vanished_grace_s=2)
    requeued, claimed, running = [], [], []
    for _ in range(trials):
        a = procs.consumer("--concurrency", "4")
        a.worker_id()
        ids = publish(settings, "work", [{"sleep_first": 120} for _ in range(4)])
        wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)",
                                  ids) == 4, 15, "4 jobs running in A")
        b = procs.consumer("--concurrency", "4")
        b.worker_id()
        a.kill()
        t0 = time.monotonic()
        wait_until(lambda: db.val("SELECT bool_and(stalls + suspect_stalls > 0) FROM jobq.job "
                                  "WHERE id = ANY($1)", ids), 40, "requeue", interval=0.005)
        requeued.append(time.monotonic() - t0)
        wait_until(lambda: db.val("SELECT bool_and(attempts >= 2) FROM jobq.job "
                                  "WHERE id = ANY($1)", ids), 40, "claim", interval=0.005)
        claimed.append(time.monotonic() - t0)
        wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)",
                                  ids) == 8, 60, "rerun", interval=0.005)
        running.append(time.monotonic() - t0)
        wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                                  "status = 'completed'", ids) == 4, 60, "completion")
        b.kill()
    return {"kill_to_requeued": summary(requeued), "kill_to_claimed_again": summary(claimed),
            "kill_to_running_again": summary(running)}


def stops(db: SyncDB, procs: Procs, settings: Settings, trials: int,
          parallel: int) -> dict[str, Any]:
    lease_s = 30.0
    set_queue(db, "work", lease_s=lease_s, vanished_grace_s=2)
    latencies: list[float] = []
    while len(latencies) < trials:
        n = min(parallel, trials - len(latencies))
        frozen = [procs.consumer("--concurrency", "1") for _ in range(n)]
        for p in frozen:
            p.worker_id()
        ids = publish(settings, "work", [{"sleep_first": 600} for _ in range(n)])
        wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)",
                                  ids) == n, 15, "jobs running")
        t0 = time.monotonic()
        for p in frozen:
            p.signal(signal.SIGSTOP)
        pending = set(ids)
        while pending:
            done = {r["id"] for r in db.fetch(
                "SELECT id FROM jobq.job WHERE id = ANY($1) AND stalls + suspect_stalls > 0",
                list(pending))}
            for _ in done:
                latencies.append(time.monotonic() - t0)
            pending -= done
            assert time.monotonic() - t0 < lease_s + 30, "not requeued"
            time.sleep(0.01)
        for p in frozen:
            p.kill()
        db.execute("UPDATE jobq.job SET status = 'cancelled' WHERE id = ANY($1)", ids)
    return {"sigstop_to_requeued": summary(latencies), "lease_s": lease_s}


def poison(db: SyncDB, procs: Procs, settings: Settings) -> dict[str, Any]:
    set_queue(db, "work", lease_s=30, vanished_grace_s=2, max_stalls=3, stall_cooldown_s=1)
    db.execute("DELETE FROM jobq.job")
    first = procs.consumer("--concurrency", "8")
    first.worker_id()
    healthy = publish(settings, "work", [{"sleep_first": 3} for _ in range(7)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)",
                              healthy) == 7, 10, "7 healthy running")
    (bad,) = publish(settings, "work", [{"kill_on_attempt": 999}])
    t0 = time.monotonic()
    fleet = [first]
    while db.val("SELECT status FROM jobq.job WHERE id = $1", bad) != "failed" or db.val(
            "SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status <> 'completed'",
            healthy):
        assert time.monotonic() - t0 < 120
        fleet = [c for c in fleet if c.alive()]
        while len(fleet) < 2:
            fleet.append(procs.consumer("--concurrency", "8"))
        time.sleep(0.05)
    row = db.fetchrow("SELECT stalls, suspect_stalls, last_error FROM jobq.job WHERE id = $1",
                      bad)
    h = db.fetch("SELECT status, stalls, suspect_stalls FROM jobq.job WHERE id = ANY($1)",
                 healthy)
    for p in fleet:
        p.kill()
    return {"poison_status": "failed", "poison_stalls": row["stalls"],
            "poison_suspect_stalls": row["suspect_stalls"],
            "healthy_completed": sum(r["status"] == "completed" for r in h),
            "healthy_max_stalls": max(r["stalls"] for r in h),
            "healthy_max_suspect_stalls": max(r["suspect_stalls"] for r in h),
            "seconds": round(time.monotonic() - t0, 1)}


def run(kills_n: int = 20, stops_n: int = 20, stop_parallel: int = 5) -> dict[str, Any]:
    """All detection figures in one scratch database (bench/run.py --detection)."""
    with world(("work",), "detect") as w:
        w.procs.reaper()
        result: dict[str, Any] = {"lease_s": 30.0, "vanished_grace_s": 2.0}
        if kills_n:
            result.update(kills(w.db, w.procs, w.settings, kills_n))
        if stops_n:
            result.update(stops(w.db, w.procs, w.settings, stops_n, stop_parallel))
        result["poison_7_healthy_concurrency_8"] = poison(w.db, w.procs, w.settings)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--stops", type=int, default=20)
    p.add_argument("--stop-parallel", type=int, default=5)
    a = p.parse_args()
    print(json.dumps(run(a.kills, a.stops, a.stop_parallel), indent=2))


if __name__ == "__main__":
    main()
