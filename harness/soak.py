"""The soak scenario: thousands of jobs while consumers are SIGKILLed and
restarted every few seconds and reapers now and then. The suite runs it
short (tests/e2e/test_soak.py), ``bench/soak.py`` long.

Each handler start is logged in test_run (harness/apps.py), so re-runs are
counted from the database: re-runs must not exceed the number of jobs that
were active in a consumer at the moment it was killed.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.helpers import Procs, SyncDB, publish, set_queue
from jobq.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def soak(db_url: str, amqp_url: str, namespace: str, *, jobs: int, consumers: int = 3,
         reapers: int = 2, concurrency: int = 8, lease_s: float = 2.0,
         kill_every_s: float = 3.0, max_sleep_s: float = 0.3, timeout_s: float = 600,
         logdir: Path | None = None, seed: int | None = None) -> dict[str, Any]:
    rng = random.Random(seed)
    db = SyncDB(db_url)
    set_queue(db, "work", lease_s=lease_s, max_stalls=1000, stall_cooldown_s=0.1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    env.update({
        "JOBQ_DATABASE_URL": db_url, "JOBQ_AMQP_URL": amqp_url, "JOBQ_NAMESPACE": namespace,
        "JOBQ_AMQP_HEARTBEAT_S": "2", "JOBQ_LOG_LEVEL": "INFO",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    procs = Procs(env, logdir or Path(tempfile.mkdtemp(prefix="jobq-soak-")))
    try:
        reaper_procs = [procs.reaper() for _ in range(reapers)]
        fleet = [procs.consumer("--concurrency", str(concurrency)) for _ in range(consumers)]
        ids_by_proc = {p.pid: p.worker_id() for p in fleet}
        settings = Settings(database_url=db_url, amqp_url=amqp_url, namespace=namespace)
        started = time.monotonic()
        ids: list[Any] = []
        for chunk in range(0, jobs, 500):
            n = min(500, jobs - chunk)
            ids += publish(settings, "work",
                           [{"sleep": round(rng.uniform(0, max_sleep_s), 3)} for _ in range(n)])
        kills = reaper_restarts = in_flight_at_kills = 0
        latencies: list[float] = []
        next_kill = time.monotonic() + kill_every_s
        while True:
            done = db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
            if done == jobs:
                break
            if time.monotonic() - started > timeout_s:
                break
            if time.monotonic() >= next_kill:
                victim = fleet.pop(rng.randrange(len(fleet)))
                victim.kill()
                killed_at = time.monotonic()
                kills += 1
                held = [r["id"] for r in db.fetch(
                    "SELECT id FROM jobq.job WHERE status = 'active' AND worker_id = $1",
                    ids_by_proc[victim.pid])]
                in_flight_at_kills += len(held)
                new = procs.consumer("--concurrency", str(concurrency))
                fleet.append(new)
                ids_by_proc[new.pid] = new.worker_id()
                if held:  # detection latency of the first held job: kill -> requeued
                    deadline = killed_at + lease_s + 5
                    while time.monotonic() < deadline:
                        # requeued: no longer the victim's active job (a
                        # job of a worker that held several is not charged)
                        if db.val("SELECT status <> 'active' OR worker_id <> $2 FROM jobq.job "
                                  "WHERE id = $1", held[0], ids_by_proc[victim.pid]):
                            latencies.append(time.monotonic() - killed_at)
                            break
                        time.sleep(0.01)
                if kills % 4 == 0:  # a reaper dies now and then
                    r = reaper_procs.pop(rng.randrange(len(reaper_procs)))
                    r.kill()
                    reaper_procs.append(procs.reaper())
                    reaper_restarts += 1
                next_kill = time.monotonic() + kill_every_s
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        starts = db.val("SELECT count(*) FROM test_run")
        lost = db.val("SELECT count(*) FROM jobq.job WHERE status <> 'completed'")
        failed = db.val("SELECT count(*) FROM jobq.job WHERE status = 'failed'")
        return {
            "jobs": jobs, "completed": jobs - lost, "lost": lost, "failed": failed,
            "handler_starts": starts, "reruns": starts - (jobs - lost),
            "in_flight_at_kills": in_flight_at_kills, "consumer_kills": kills,
            "reaper_restarts": reaper_restarts, "seconds": round(elapsed, 1),
            "jobs_per_s": round(jobs / elapsed, 1),
            "detect_p50_s": round(statistics.median(latencies), 2) if latencies else None,
            "detect_max_s": round(max(latencies), 2) if latencies else None,
            "lease_s": lease_s, "consumers": consumers, "concurrency": concurrency,
            "reapers": reapers, "kill_every_s": kill_every_s,
        }
    finally:
        procs.close()
        db.close()
