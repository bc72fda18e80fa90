"""What one job costs, for docs/scaling.md (issue #15):

    .venv/bin/python bench/scaling.py [--jobs 20000]

Steady end to end (2 consumers of concurrency 16, a producer of 16
concurrent single-job publishes; then the same with publish_many batches of
100), on a quiet machine. Per job: PostgreSQL transactions (commits in
pg_stat_database), row writes (pg_stat_user_tables: inserts + updates +
deletes, HOT updates among them), WAL bytes (pg_current_wal_lsn), server
CPU (PostgreSQL and RabbitMQ processes, from /proc) and the services' Python
CPU; and the connections each service holds while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import service_env, world
from publish_path import pings, run_json, snapshot

from harness.helpers import SyncDB

COUNTERS = """
SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS tx,
       (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables
        WHERE schemaname = 'jobq') AS writes,
       (SELECT sum(n_tup_hot_upd) FROM pg_stat_user_tables WHERE schemaname = 'jobq') AS hot,
       pg_current_wal_lsn() AS lsn"""


def counters(db: SyncDB) -> dict[str, Any]:
    """Backends flush their statistics when idle, at the latest after 10 s
    (PGSTAT_IDLE_INTERVAL): wait for that first."""
    time.sleep(11)
    return dict(db.fetchrow(COUNTERS))


def steady(n: int, batch: int) -> dict[str, Any]:
    with world(("noop",), "scaling", JOBQ_LOG_LEVEL="WARNING",
               PYTHONPATH=f"{HERE}{os.pathsep}{HERE.parent}") as w:
        w.db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('noop', 30)")
        env = service_env(w.db_url, w.amqp_url, w.settings.namespace, JOBQ_LOG_LEVEL="WARNING")
        with pings(n + 1) as (port, first, done):
            cons = [w.procs.start("consume", "ping_app:app", "--concurrency", "16",
                                  PING_PORT=str(port)) for _ in range(2)]
            reaper = w.procs.start("reap")
            asyncio.run(_one(w.settings))
            first()
            c0 = counters(w.db)
            s0 = snapshot({c.popen.pid for c in cons} | {reaper.popen.pid})
            prod = run_json([sys.executable, str(HERE / "producer_jobq.py"), str(n),
                             "16" if batch == 1 else "1", str(batch)], env)
            out = done()
            s1 = snapshot({c.popen.pid for c in cons} | {reaper.popen.pid})
            c1 = counters(w.db)
            conns = {r["app"]: r["n"] for r in w.db.fetch(
                "SELECT application_name AS app, count(*) AS n FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'jobq%' "
                "GROUP BY 1")}
            for c in cons:
                c.kill()
        wal = int(c1["lsn"]) - int(c0["lsn"])  # asyncpg reads pg_lsn as an integer
    return {
        "shape": "single-job publishes, 16 concurrent" if batch == 1
        else f"publish_many batches of {batch}",
        "jobs_per_s": round(n / (out["last"] - prod["t0"])),
        "pg_transactions_per_job": round((c1["tx"] - c0["tx"]) / n, 3),
        "row_writes_per_job": round(float(c1["writes"] - c0["writes"]) / n, 2),
        "hot_updates_per_job": round(float(c1["hot"] - c0["hot"]) / n, 2),
        "wal_bytes_per_job": round(float(wal) / n),
        "pg_cpu_us_per_job": round((s1["pg"] - s0["pg"]) / n * 1e6),
        "rabbitmq_cpu_us_per_job": round((s1["mq"] - s0["mq"]) / n * 1e6),
        "consumers_reaper_cpu_us_per_job": round((s1["workers"] - s0["workers"]) / n * 1e6),
        "producer_cpu_us_per_job": round(prod["cpu_s"] / n * 1e6),
        "connections": conns,
    }


async def _one(settings: Any) -> None:
    from jobq.client.producer import Client

    async with Client(settings) as c:
        await c.publish("noop", {})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=20000)
    a = p.parse_args()
    rows = [steady(a.jobs, 1), steady(a.jobs, 100)]
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
