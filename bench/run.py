"""jobq benchmarks: one entry point, one table (and JSON), medians of runs.

    .venv/bin/python bench/run.py --all          # everything below, ~30 min
    .venv/bin/python bench/run.py [--jobs 20000] [--runs 3] [--peers]
                                  [--history-off] [--detection] [--scale] [--publish]

Measured on this machine's PostgreSQL and RabbitMQ, all processes on the same
cores. No-op handlers; figures from the database clock (created_at,
started_at, finished_at) so process start-up is not counted. Throughput
figures are medians of --runs runs; ratios between systems are taken within
each run, then their median is reported. --detection runs bench/detection.py
(3 SIGKILLs each of consumers holding 1, 8 and 32 jobs of 5 s, --trials SIGSTOPs,
the poison job, child deaths, CPU-bound pools), --scale runs bench/scale.py
(10 k vs 1 M finished rows, heartbeats, RSS, kill-every-5-s chaos as the
median of --runs pairs). The soak (bench/soak.py) and the fault table
(bench/faults.py) stay separate: they are correctness runs, not speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import world

import jobq
from harness.helpers import Procs, SyncDB, wait_until
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.settings import Settings

CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "32"))


def purge(settings: Settings) -> None:
    """Drop messages left from the previous phase (their rows are gone)."""
    import aio_pika
    import aiormq

    async def go() -> None:
        conn = await aio_pika.connect(settings.amqp_url)
        try:
            q = await (await conn.channel()).get_queue(f"{settings.namespace}.noop")
            await q.purge()
        except aiormq.exceptions.ChannelNotFoundEntity:
            pass
        finally:
            await conn.close()

    asyncio.run(go())


def reset(db: SyncDB, history: bool = True, settings: Settings | None = None) -> None:
    if settings is not None:
        purge(settings)
    db.execute("TRUNCATE jobq.job, jobq.worker CASCADE")
    db.execute("INSERT INTO jobq.queue (name) VALUES ('noop') ON CONFLICT DO NOTHING")
    db.execute("UPDATE jobq.queue SET history = $1, lease_s = 30 WHERE name = 'noop'", history)
    db.execute("VACUUM ANALYZE jobq.job")


def publish_rates(settings: Settings, n: int) -> dict[str, float]:
    async def go() -> dict[str, float]:
        async with Client(settings) as c:
            single = min(n, 2000)
            t0 = time.perf_counter()
            for _ in range(single):
                await c.publish("noop", {})
            t1 = time.perf_counter()
            for i in range(0, n, 500):
                await c.publish_many([NewJob("noop", {}) for _ in range(min(500, n - i))])
            t2 = time.perf_counter()
        return {"publish_single_per_s": single / (t1 - t0),
                "publish_batched_per_s": n / (t2 - t1)}

    return asyncio.run(go())


def db_rate(db: SyncDB, start_col: str) -> float:
    row = db.fetchrow(f"SELECT count(*) AS n, extract(epoch FROM max(finished_at) - "
                      f"min({start_col}))::float8 AS s FROM jobq.job WHERE status = 'completed'")
    return float(row["n"] / row["s"]) if row["s"] else 0.0


def drain(db: SyncDB, procs: Procs, settings: Settings, n: int, consumers: int) -> float:
    """Backlog of n jobs, then `consumers` processes drain it."""
    async def fill() -> None:
        async with Client(settings) as c:
            for i in range(0, n, 1000):
                await c.publish_many([NewJob("noop", {}) for _ in range(min(1000, n - i))])

    asyncio.run(fill())
    started = [procs.start("consume", "noop_app:app", "--concurrency", str(CONCURRENCY))
               for _ in range(consumers)]
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") == n,
               600, "backlog drained", interval=0.2)
    for p in started:
        p.kill()
    return db_rate(db, "started_at")


def steady(db: SyncDB, procs: Procs, settings: Settings, n: int, consumers: int) -> float:
    """Producer and consumers together: created -> completed for n jobs."""
    started = [procs.start("consume", "noop_app:app", "--concurrency", str(CONCURRENCY))
               for _ in range(consumers)]
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.worker WHERE vanished_at IS NULL")
               >= consumers, 30, "consumers registered")

    async def produce() -> None:
        async with Client(settings) as c:
            for i in range(0, n, 100):
                await c.publish_many([NewJob("noop", {}) for _ in range(min(100, n - i))])

    asyncio.run(produce())
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") == n,
               600, "all completed", interval=0.2)
    for p in started:
        p.kill()
    return db_rate(db, "created_at")


def latency(db: SyncDB, procs: Procs, settings: Settings, rate: float,
            seconds: float) -> dict[str, float]:
    """publish -> handler start at a moderate rate, one job per publish call."""
    c = procs.start("consume", "noop_app:app", "--concurrency", str(CONCURRENCY))
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.worker WHERE vanished_at IS NULL")
               >= 1, 30, "consumer registered")

    async def produce() -> int:
        sent = 0
        async with Client(settings) as client:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                await client.publish("noop", {})
                sent += 1
                await asyncio.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
        return sent

    sent = asyncio.run(produce())
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
               == sent, 60, "all completed", interval=0.2)
    c.kill()
    ms = sorted(float(r["ms"]) for r in db.fetch(
        "SELECT extract(epoch FROM started_at - created_at) * 1000 AS ms FROM jobq.job"))
    return {"latency_p50_ms": ms[len(ms) // 2], "latency_p99_ms": ms[int(len(ms) * 0.99) - 1],
            "latency_rate_per_s": rate}


def substrate(db_url: str, amqp_url: str, n: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(HERE / "substrate.py"), db_url, amqp_url,
                          str(n)], capture_output=True, text=True, check=True)
    return {f"substrate_{k}": v for k, v in json.loads(out.stdout).items()}


def one_run(n: int, history: bool = True) -> dict[str, float]:
    res: dict[str, float] = {}
    with world(("noop",), "bench", JOBQ_LOG_LEVEL="WARNING",
               PYTHONPATH=f"{HERE}{os.pathsep}{HERE.parent}") as w:
        db, procs, settings = w.db, w.procs, w.settings
        res.update(substrate(w.db_url, w.amqp_url, min(n, 5000)))
        reset(db, history, settings)
        res.update(publish_rates(settings, n))
        for k in (1, 2):
            reset(db, history, settings)
            res[f"drain_{k}c_per_s"] = drain(db, procs, settings, n, k)
            reset(db, history, settings)
            res[f"steady_{k}c_per_s"] = steady(db, procs, settings, n, k)
        reset(db, history, settings)
        res.update(latency(db, procs, settings, 200, 10))
    res["jobq_vs_substrate_drain_2c"] = res["drain_2c_per_s"] / res["substrate_drain_per_s"]
    return res


def conditions(n: int) -> dict[str, Any]:
    async def versions() -> tuple[str, str]:
        import aio_pika
        from benchenv import ADMIN_URL, AMQP_URL

        c = await asyncpg.connect(ADMIN_URL)
        pg = await c.fetchval("SHOW server_version")
        await c.close()
        conn = await aio_pika.connect(AMQP_URL)
        mq = conn.transport.connection.server_properties.get("version", b"?")  # type: ignore
        await conn.close()
        return pg, mq.decode() if isinstance(mq, bytes) else str(mq)

    pg, mq = asyncio.run(versions())
    return {"jobq": jobq.__version__, "python": platform.python_version(),
            "postgresql": pg, "rabbitmq": mq, "cpus": os.cpu_count(), "jobs_per_run": n,
            "consumer_concurrency": CONCURRENCY, "lease_s": 30, "handler": "no-op",
            "log_level": "WARNING", "event_loop": "uvloop"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--peers", action="store_true", help="also Celery, procrastinate, pgqueuer")
    p.add_argument("--history-off", action="store_true", help="also a run with history off")
    p.add_argument("--detection", action="store_true", help="also bench/detection.py")
    p.add_argument("--trials", type=int, default=20,
                   help="SIGSTOPs (detection; SIGKILLs: 3 per N = 1, 8, 32)")
    p.add_argument("--scale", action="store_true", help="also bench/scale.py")
    p.add_argument("--publish", action="store_true",
                   help="also bench/publish_path.py's run (the publish path with its peers: "
                        "16 concurrent single-job publishes, CPU per job, latency, the "
                        "broker's own limit), in the same runs")
    p.add_argument("--all", action="store_true",
                   help="--peers --history-off --detection --scale --publish")
    p.add_argument("--json", default=str(HERE / "results" / "latest.json"))
    a = p.parse_args()
    if a.all:
        a.peers = a.history_off = a.detection = a.scale = a.publish = True
    runs = []
    for i in range(a.runs):
        r = one_run(a.jobs)
        if a.peers:
            from peers import run_peers

            r.update(run_peers(a.jobs))
            for peer in ("celery", "celery_prefork", "procrastinate", "pgqueuer"):
                if r.get(f"{peer}_drain_per_s"):
                    r[f"jobq_drain_2c_vs_{peer}"] = r["drain_2c_per_s"] / r[f"{peer}_drain_per_s"]
            if r.get("pgqueuer_steady_per_s"):
                r["jobq_steady_2c_vs_pgqueuer_steady"] = (r["steady_2c_per_s"]
                                                          / r["pgqueuer_steady_per_s"])
        if a.publish:
            import publish_path

            r.update({f"publish_path.{k}": v
                      for k, v in publish_path.one_run(min(a.jobs, 10000), 16).items()})
        if a.history_off:
            off = one_run(a.jobs, history=False)
            r["history_off_drain_2c_per_s"] = off["drain_2c_per_s"]
            r["history_cost_drain_2c"] = 1 - r["drain_2c_per_s"] / off["drain_2c_per_s"]
        runs.append(r)
        print(f"run {i + 1}: " + json.dumps({k: round(v, 2) for k, v in r.items()}),
              file=sys.stderr)
    keys = sorted({k for r in runs for k in r})
    median = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
    out: dict[str, Any] = {"conditions": conditions(a.jobs), "runs": runs, "median": median}
    out["conditions"]["runs"] = len(runs)
    if a.peers:
        from peers import PINS

        out["conditions"]["peers"] = PINS
    if a.detection:
        import detection

        out["detection"] = detection.run(3, a.trials)
    if a.scale:
        import scale

        out["scale"] = scale.run(chaos_runs=a.runs)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2))
    print(f"conditions: {json.dumps(out['conditions'])}")
    print(f"| figure | value ({len(runs)} runs: median) |")
    print("|---|---:|")
    for k in keys:
        print(f"| {k} | {median[k]:,.2f} |")
    for section in ("detection", "scale"):
        for k, v in _flat(out.get(section, {}), section):
            print(f"| {k} | {v:,.2f} |" if isinstance(v, float) else f"| {k} | {v} |")


def _flat(d: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flat(v, f"{prefix}.{k}")
        elif not isinstance(v, list):
            rows.append((f"{prefix}.{k}", v))
    return rows


if __name__ == "__main__":
    main()
