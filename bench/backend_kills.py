"""Claim latency at baseline and while the consumer's database backends are
terminated twice a second (issue #19): the kind of thing a failover, a pooler
restart or an idle-connection killer does.

A producer publishes single jobs (1 ms handlers) at a steady rate into one
consumer of concurrency 16 with a 30 s lease; for each job, publish -> claim
is `started_at - created_at` on the database clock. Also: stalls or suspect
marks charged (jobq's own errors must cost none), the slowest claim ->
completion (a job left to its lease would take 30 s), jobs run twice.

    .venv/bin/python bench/backend_kills.py [--seconds 20] [--rate 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchenv import world
from detection import pct

from harness.helpers import SyncDB, set_queue, wait_until
from jobq.settings import Settings


def produce(settings: Settings, rate: float, for_s: float, out: list[Any]) -> None:
    from jobq.producer import Client

    async def go() -> None:
        async with Client(settings) as client:
            deadline = time.monotonic() + for_s
            while time.monotonic() < deadline:
                tick = time.monotonic()
                for _ in range(int(rate / 10)):
                    out.append(await client.publish("work", {"sleep": 0.001}))
                await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))

    asyncio.run(go())


def killer(url: str, every_s: float, stop: threading.Event, count: list[int]) -> None:
    db = SyncDB(url)
    try:
        while not stop.is_set():
            count[0] += db.val("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name LIKE 'jobq-consumer%' "
                               "AND datname = current_database()")
            time.sleep(every_s)
    finally:
        db.close()


def measure(kill: bool, seconds: float, rate: float) -> dict[str, Any]:
    with world(("work",), "kills") as w:
        set_queue(w.db, "work", lease_s=30)
        w.procs.reaper()
        w.procs.consumer("--concurrency", "16").worker_id()
        ids: list[Any] = []
        stop, kills = threading.Event(), [0]
        threads = [threading.Thread(target=produce, args=(w.settings, rate, seconds, ids))]
        if kill:
            threads.append(threading.Thread(target=killer, args=(w.db_url, 0.5, stop, kills)))
        for t in threads:
            t.start()
        threads[0].join()
        stop.set()
        for t in threads[1:]:
            t.join()
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE status <> "
                                    "'completed'") == 0, 120, "drain", interval=0.2)
        rows = w.db.fetch("SELECT (extract(epoch FROM started_at - created_at) * 1000)::float8 "
                          "AS ms FROM jobq.job")
        lat = [r["ms"] for r in rows]
        agg = w.db.fetchrow(
            "SELECT coalesce(sum(stalls + suspect_stalls), 0)::int AS charged, "
            "max(extract(epoch FROM finished_at - started_at))::float8 AS slowest_s, "
            "(SELECT count(*) - count(DISTINCT job_id) FROM test_run)::int AS twice "
            "FROM jobq.job")
        return {"jobs": len(ids), "backends_killed": kills[0],
                "claim_ms_p50": round(pct(lat, 0.5), 1), "claim_ms_p99": round(pct(lat, 0.99), 1),
                "claim_ms_max": round(max(lat), 1), "charged": agg["charged"],
                "slowest_claim_to_done_s": round(agg["slowest_s"], 2), "ran_twice": agg["twice"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--rate", type=float, default=300)
    a = p.parse_args()
    base = measure(False, a.seconds, a.rate)
    kills = measure(True, a.seconds, a.rate)
    out = {"rate_jobs_per_s": a.rate, "seconds": a.seconds, "baseline": base,
           "backend_kills_2_per_s": kills,
           "p99_ratio": round(kills["claim_ms_p99"] / max(base["claim_ms_p99"], 0.01), 2)}
    print(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
