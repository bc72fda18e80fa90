"""Scale figures (issue #7):

- reaper sweep time and claim time with 10 k vs 1 M finished rows in jobq.job
  (finished rows must not slow the hot path);
- heartbeat statements per second with 1,000 jobs in flight across 4 consumer
  processes (one batched statement per process per renew interval);
- RSS of an idle and a busy consumer;
- throughput while a consumer is SIGKILLed every 5 s, as a share of steady.

    .venv/bin/python bench/scale.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world

from harness.helpers import Procs, SyncDB, free_port, wait_until
from jobq import lease
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.reaper import Reaper
from jobq.settings import Settings


def finished_rows(db: SyncDB, n: int) -> None:
    db.execute("TRUNCATE jobq.job CASCADE")
    db.execute("INSERT INTO jobq.queue (name) VALUES ('noop') ON CONFLICT DO NOTHING")
    db.execute("""INSERT INTO jobq.job (queue, status, attempts, lock, worker_id,
                   started_at, finished_at, published_at)
                  SELECT 'noop', 'completed', 1, gen_random_uuid(), 'w', now(), now(), now()
                  FROM generate_series(1, $1)""", n)
    db.execute("VACUUM ANALYZE jobq.job")


def sweep_and_claim_ms(settings: Settings, active: int = 100) -> dict[str, float]:
    async def go() -> dict[str, float]:
        reaper = Reaper(settings)
        await reaper.connect(wait=False)
        assert reaper.pool is not None
        pool = reaper.pool
        try:
            # some live work besides the finished rows
            ids = [await pool.fetchval("SELECT jobq.enqueue('noop', '{}', 0, NULL, 3600)")
                   for _ in range(active)]
            await lease.claim(pool, ids, "bench", ["noop"])
            sweeps = []
            for _ in range(50):
                t0 = time.perf_counter()
                await reaper.run_once(await reaper.probe())  # as the loop does
                await reaper.probe()
                sweeps.append(time.perf_counter() - t0)
            claims = []
            for _ in range(200):
                jid = await pool.fetchval("SELECT jobq.enqueue('noop', '{}', 0, NULL, 3600)")
                t0 = time.perf_counter()
                await lease.claim(pool, [jid], "bench", ["noop"])
                claims.append(time.perf_counter() - t0)
            return {"sweep_ms": statistics.median(sweeps) * 1000,
                    "claim_ms": statistics.median(claims) * 1000}
        finally:
            await reaper.close()

    return asyncio.run(go())


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def heartbeats_and_rss(db: SyncDB, procs: Procs, settings: Settings) -> dict[str, float]:
    db.execute("TRUNCATE jobq.job CASCADE")
    db.execute("UPDATE jobq.queue SET lease_s = 30 WHERE name = 'work'")
    db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('work', 30) "
               "ON CONFLICT (name) DO UPDATE SET lease_s = 30")
    ports = [free_port() for _ in range(4)]
    fleet = [procs.consumer("--concurrency", "250", JOBQ_HEALTH_PORT=str(p)) for p in ports]
    for c in fleet:
        c.worker_id()
    time.sleep(2)
    idle_rss = statistics.median(rss_mb(c.pid) for c in fleet)

    async def fill() -> None:
        async with Client(settings) as client:
            await client.publish_many([NewJob("work", {"sleep": 120}) for _ in range(1000)])

    asyncio.run(fill())
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'active'") == 1000,
               60, "1000 jobs in flight", interval=0.2)
    before = sum(metric(p, 'jobq_lease_renewals_total{result="ok"}') for p in ports)
    t0 = time.monotonic()
    time.sleep(20)
    after = sum(metric(p, 'jobq_lease_renewals_total{result="ok"}') for p in ports)
    busy_rss = statistics.median(rss_mb(c.pid) for c in fleet)
    for c in fleet:
        c.kill()
    return {"in_flight": 1000, "consumers": 4,
            "heartbeat_statements_per_s": (after - before) / (time.monotonic() - t0),
            "expected_per_s_at_lease_30": 4 / 10, "rss_idle_mb": idle_rss,
            "rss_busy_250_jobs_mb": busy_rss}


def chaos(db: SyncDB, procs: Procs, settings: Settings, n: int = 20000) -> dict[str, float]:
    """Drain n short jobs with 2 consumers; once steady, and once while a
    consumer is SIGKILLed (and replaced) every 5 s."""
    def run(kill: bool) -> float:
        db.execute("TRUNCATE jobq.job, jobq.worker CASCADE")
        db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('work', 5) "
                   "ON CONFLICT (name) DO UPDATE SET lease_s = 5")

        async def fill() -> None:
            async with Client(settings) as client:
                for _ in range(0, n, 1000):
                    await client.publish_many([NewJob("work", {"sleep": 0.02})
                                               for _ in range(1000)])

        asyncio.run(fill())
        fleet = [procs.consumer("--concurrency", "32", JOBQ_LOG_LEVEL="WARNING")
                 for _ in range(2)]
        t0 = time.monotonic()
        next_kill = t0 + 5
        while db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") < n:
            if kill and time.monotonic() >= next_kill:
                fleet.pop(0).kill()
                fleet.append(procs.consumer("--concurrency", "32", JOBQ_LOG_LEVEL="WARNING"))
                next_kill += 5
            assert time.monotonic() - t0 < 600
            time.sleep(0.05)
        rate = n / (time.monotonic() - t0)
        for c in fleet:
            c.kill()
        return rate

    steady = run(False)
    chaotic = run(True)
    return {"steady_per_s": steady, "kill_every_5s_per_s": chaotic,
            "chaos_share": chaotic / steady}


def run(chaos_runs: int = 1) -> dict[str, Any]:
    """All scale figures in one scratch database (bench/run.py --scale). The
    chaos share is the median of ``chaos_runs`` steady/chaotic pairs."""
    out: dict[str, Any] = {}
    with world(("noop", "work"), "scale", JOBQ_LOG_LEVEL="INFO") as w:
        db, procs, settings = w.db, w.procs, w.settings
        for n in (10_000, 1_000_000):
            finished_rows(db, n)
            out[f"finished_{n}"] = sweep_and_claim_ms(settings)
        out["sweep_ratio_1m_vs_10k"] = (out["finished_1000000"]["sweep_ms"]
                                        / out["finished_10000"]["sweep_ms"])
        out["claim_ratio_1m_vs_10k"] = (out["finished_1000000"]["claim_ms"]
                                        / out["finished_10000"]["claim_ms"])
        db.execute("TRUNCATE jobq.job CASCADE")
        out["reaper"] = "one reaper running for the chaos run"
        out.update(heartbeats_and_rss(db, procs, settings))
        procs.reaper()
        pairs = [chaos(db, procs, settings) for _ in range(chaos_runs)]
        out["chaos_runs"] = pairs
        out["chaos"] = {k: statistics.median(p[k] for p in pairs) for k in pairs[0]}
    return out


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--chaos-runs", type=int, default=1)
    print(json.dumps(run(p.parse_args().chaos_runs), indent=2))


if __name__ == "__main__":
    main()
