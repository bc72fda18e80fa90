"""Signal -> resume, over every job (issue #52): how long after a signal's
commit a parked job's handler runs again, p50/p99/max.

    .venv/bin/python bench/suspension.py [--jobs 200] [--rate 20] [--consumers 2]

A fresh database and vhost (benchenv.scratch), one reaper, ``--consumers``
``jobq consume harness.apps:app --queue waits``. ``--jobs`` jobs each wait
for signal "go" (harness/waits.py); once every one is parked (its first run
ended 'suspended'), a producer sends their signals one at a time at
``--rate`` a second through SQL ``jobq.signal``, each in its own committed
transaction whose commit time is read back (clock_timestamp() just before
COMMIT). The resume is the handler's second start in test_run (the database
clock). Also printed: every job completed, each with exactly 2 runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import scratch

from harness.helpers import Procs, SyncDB, set_queue


async def _signal_all(db_url: str, ids: list[Any], rate: float) -> dict[Any, Any]:
    """Each id's signal committed alone, paced; id -> the time just before COMMIT."""
    conn = await asyncpg.connect(db_url)
    sent = {}
    try:
        for jid in ids:
            async with conn.transaction():
                await conn.fetchval("SELECT jobq.signal($1, 'go', '1')", jid)
                sent[jid] = await conn.fetchval("SELECT clock_timestamp()")
            await asyncio.sleep(1 / rate)
    finally:
        await conn.close()
    return sent


def run(jobs: int, rate: float, consumers: int) -> dict[str, Any]:
    with scratch(("waits",)) as (db_url, amqp_url, namespace):
        db = SyncDB(db_url)
        set_queue(db, "waits", lease_s=5)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
        env.update({"JOBQ_DATABASE_URL": db_url, "JOBQ_AMQP_URL": amqp_url,
                    "JOBQ_NAMESPACE": namespace, "HARNESS_DATABASE_URL": db_url,
                    "PYTHONPATH": str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")})
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-suspension-")))
        try:
            procs.reaper()
            for _ in range(consumers):
                procs.consumer("--queue", "waits", "--concurrency", "16").worker_id()
            ids = [r["id"] for r in db.fetch(
                "SELECT jobq.enqueue('waits', '{\"signal\": \"go\"}') AS id "
                "FROM generate_series(1, $1)", jobs)]
            deadline = time.monotonic() + 120
            while db.val("SELECT count(*) FROM jobq.job WHERE wake_on = 'go'") < jobs:
                if time.monotonic() > deadline:
                    raise SystemExit("the jobs did not all park within 120 s")
                time.sleep(0.2)
            sent = asyncio.run(_signal_all(db_url, ids, rate))
            while db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") < jobs:
                if time.monotonic() > deadline + 120:
                    raise SystemExit("not every job completed")
                time.sleep(0.2)
            second = {r["job_id"]: r["started_at"] for r in db.fetch(
                "SELECT job_id, max(started_at) AS started_at FROM test_run GROUP BY job_id")}
            runs = db.val("SELECT count(*) FROM test_run")
            lat = sorted((second[j] - sent[j]).total_seconds() * 1000 for j in ids)
            return {"jobs": jobs, "rate_per_s": rate, "consumers": consumers,
                    "runs_per_job": runs / jobs,
                    "resume_ms_p50": round(statistics.median(lat), 1),
                    "resume_ms_p99": round(lat[int(0.99 * (len(lat) - 1))], 1),
                    "resume_ms_max": round(lat[-1], 1)}
        finally:
            procs.close()
            db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--consumers", type=int, default=2)
    args = ap.parse_args()
    print(run(args.jobs, args.rate, args.consumers), flush=True)


if __name__ == "__main__":
    main()
