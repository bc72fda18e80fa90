"""A fleet against one PostgreSQL (issue #37): 40 consumer processes of
concurrency 8, straight to the server and through PgBouncer.

    .venv/bin/python bench/fleet.py [--consumers 40] [--concurrency 8] [--seconds 30]

Each way in gets a PostgreSQL of its own (initdb under /tmp, this machine's
server binaries, max_connections 400 so the direct fleet is never refused and
what it holds can be counted) and the shared RabbitMQ. The fleet and one reaper
start; a producer then publishes no-op jobs as fast as it can (8 tasks of
``publish_many`` of 50) for --seconds. Measured over that window:

- sessions: backends of the job database by application name (the pools'
  and the registries'), per consumer process; through PgBouncer also its
  client connections and the server sessions it opened;
- throughput: jobs finished per second, by the database clock;
- claim statement time: ``jobq_claim_duration_seconds`` (a histogram each
  consumer serves on its health port), summed over the fleet, p50 / p99
  interpolated in their buckets (bench/scrape.py);
- publish -> start, p50 / p99 over every job of the window (the row's
  ``created_at`` to its ``started_at``, both the database clock).

PgBouncer runs in transaction mode (``default_pool_size`` 10, harness/pgbouncer.py); the consumers
set ``JOBQ_DATABASE_POOLED=true`` and keep their registry sessions direct
(``JOBQ_DIRECT_DATABASE_URL``), as docs/scaling.md says to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import benchenv
import scrape

from harness.helpers import Proc, SyncDB, free_port
from harness.pg_pair import _as
from harness.pgbouncer import PgBouncer
from harness.tls import _own_dir, _pg_bin
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.settings import Settings

CLAIM = "jobq_claim_duration_seconds"


class Server:
    """A PostgreSQL of the bench's own: its port, its data directory."""

    def __init__(self, max_connections: int = 400) -> None:
        self.bin = _pg_bin()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.dir = _own_dir("jobq-fleet-pg-", self.user)
        self.port = free_port()
        self.max_connections = max_connections

    def start(self) -> None:
        _as(self.user, str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-U",
            "postgres", "-A", "trust", "--no-sync")
        _as(self.user, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-l",
            str(self.dir / "log"), "-w", "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories="
            f"{self.dir} -c max_connections={self.max_connections}", "start")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def close(self) -> None:
        _as(self.user, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m",
            "immediate", "stop")
        _as(self.user, "rm", "-rf", str(self.dir))


def produce(settings: Settings, stop: threading.Event) -> None:
    async def one(client: Client) -> None:
        while not stop.is_set():
            await client.publish_many([NewJob("noop", {}) for _ in range(50)])

    async def go() -> None:
        async with Client(settings) as client:
            await asyncio.gather(*(one(client) for _ in range(8)))

    asyncio.run(go())


def sessions(db: SyncDB, name: str) -> dict[str, int]:
    rows = db.fetch("SELECT coalesce(application_name, '') AS app, count(*) AS n "
                    "FROM pg_stat_activity WHERE datname = $1 GROUP BY 1", name)
    return {r["app"] or "(none)": int(r["n"]) for r in rows}


def one_way(way: str, consumers: int, concurrency: int, seconds: float) -> dict[str, Any]:
    server = Server()
    server.start()
    bouncer = PgBouncer(server.url()) if way == "pgbouncer" else None
    fleet: list[Proc] = []
    try:
        if bouncer is not None:
            bouncer.start()
        benchenv.ADMIN_URL = server.url()  # scratch() makes its database there
        with benchenv.world(("noop",), f"fleet-{way}") as w:
            name = w.db_url.rsplit("/", 1)[1]
            admin = SyncDB(server.url())
            extra: dict[str, str] = {}
            if bouncer is not None:
                extra = {"JOBQ_DATABASE_URL": bouncer.url(w.db_url),
                         "JOBQ_DATABASE_POOLED": "true", "JOBQ_DIRECT_DATABASE_URL": w.db_url}
            ports = [free_port() for _ in range(consumers)]
            started = time.monotonic()
            for port in ports:
                fleet.append(w.procs.start(
                    "consume", "noop_app:app", "--concurrency", str(concurrency),
                    environ={**extra, "JOBQ_HEALTH_PORT": str(port),
                             "JOBQ_HEALTH_HOST": "127.0.0.1",
                             "PYTHONPATH": f"{HERE}{os.pathsep}{w.procs.env['PYTHONPATH']}"}))
            for c in fleet:  # 40 start-ups share 2 cores: more than worker_id's 15 s
                c.wait_log(r"consumer ready", timeout=180)
            start_up_s = time.monotonic() - started
            w.procs.reaper(environ=extra)
            time.sleep(3)
            idle = sessions(admin, name)
            stop = threading.Event()
            feeder = threading.Thread(target=produce, args=(w.settings, stop))
            feeder.start()
            time.sleep(5)  # past the pools' growth
            before = scrape.buckets(CLAIM, ports)
            t0 = w.db.val("SELECT now()")
            time.sleep(seconds / 2)
            busy = sessions(admin, name)
            clients = len(bouncer.clients()) if bouncer is not None else None
            time.sleep(seconds / 2)
            t1 = w.db.val("SELECT now()")
            after = scrape.buckets(CLAIM, ports)
            stop.set()
            feeder.join(60)
            row = w.db.fetchrow(
                "SELECT count(*) AS n, percentile_cont(0.5) WITHIN GROUP (ORDER BY "
                "extract(epoch FROM started_at - created_at)) AS p50, percentile_cont(0.99) "
                "WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) AS p99 "
                "FROM jobq.job WHERE finished_at >= $1 AND finished_at < $2", t0, t1)
            admin.close()
            window = (t1 - t0).total_seconds()
            return {
                "way": way, "consumers": consumers, "concurrency": concurrency,
                "fleet_start_up_s": round(start_up_s, 1),
                "sessions_idle": idle, "sessions_busy": busy,
                # direct: every consumer session; through PgBouncer the
                # server sessions carry whichever client's name was last set
                "consumer_sessions_per_process_busy": round(sum(
                    n for app, n in busy.items() if app.startswith("jobq-consumer"))
                    / consumers, 2) if bouncer is None else None,
                "registry_sessions_busy": busy.get("jobq-consumer-registry", 0),
                "server_sessions_busy_total": sum(busy.values()),
                "pgbouncer_clients_busy": clients,
                "jobs_per_s": round(row["n"] / window, 1),
                "claim_p50_ms": scrape.quantile_ms(before, after, 0.5),
                "claim_p99_ms": scrape.quantile_ms(before, after, 0.99),
                "claim_statements": scrape.count(before, after),
                "publish_to_start_p50_ms": round(float(row["p50"] or 0) * 1000, 1),
                "publish_to_start_p99_ms": round(float(row["p99"] or 0) * 1000, 1),
            }
    finally:
        for c in fleet:
            c.close()
        if bouncer is not None:
            bouncer.close()
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--consumers", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--ways", nargs="*", default=["direct", "pgbouncer"],
                    choices=["direct", "pgbouncer"])
    a = ap.parse_args()
    print(f"fleet: {a.consumers} consumers of concurrency {a.concurrency}, {a.seconds:g} s "
          "of load per way in", flush=True)
    out = []
    for way in a.ways:
        out.append(one_way(way, a.consumers, a.concurrency, a.seconds))
        print(json.dumps(out[-1]), flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
