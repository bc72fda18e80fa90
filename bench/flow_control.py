"""Flow control's figures (issue #30), at full size, beside what the CI
tests assert at a smaller one (tests/e2e/test_flow.py):

- priority: a standing backlog of --backlog priority-0 jobs of 50 ms drained
  by 2 consumers of concurrency 8; 50 priority-5 jobs published one by one
  into it. Start after publish over all 50 (p50, p99, max), and the backlog's
  throughput in the 5 s before against the 5 s while they arrive.
- fairness: key A publishes --backlog jobs of 50 ms, then key B 20;
  max_running_per_key = 4, 2 consumers of concurrency 8. B's slowest
  publish -> completion, the most of A seen running at once (sampled as fast
  as the database answers), then a consumer SIGKILLed holding A's slots: the
  seconds until all 4 run again on the other (lease 30 s), and at the end
  jobs not completed and jobs completed twice.
- claim cost: server CPU of one claim of 8 keyed jobs (a queue with
  max_running_per_key), with 1,000 jobs waiting over 10 keys against
  100,000 over 1,000 keys.

    .venv/bin/python bench/flow_control.py [--backlog 5000] [--skip fairness ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import scratch, world

from harness.helpers import SyncDB, wait_until
from jobq.client.producer import Client
from jobq.db import SESSION_SETTINGS
from jobq.newjob import NewJob
from jobq.sql import Q

PATH = os.pathsep.join([str(HERE.parent / "services"), str(HERE), str(HERE.parent)])
TICK = os.sysconf("SC_CLK_TCK")


def publish(settings: Any, jobs: list[NewJob]) -> list[Any]:
    async def go() -> list[Any]:
        async with Client(settings) as c:
            out: list[Any] = []
            for i in range(0, len(jobs), 1000):
                out += await c.publish_many(jobs[i:i + 1000])
            return out

    return asyncio.run(go())


def started_between(db: SyncDB, a: float, b: float) -> int:
    return int(db.val("SELECT count(*) FROM test_run WHERE started_at >= to_timestamp($1) "
                      "AND started_at < to_timestamp($2)", a, b))


def priority(backlog: int) -> dict[str, Any]:
    with world(("fair",), "prio", JOBQ_LOG_LEVEL="WARNING", PYTHONPATH=PATH) as w:
        w.db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('prio', 30)")
        w.procs.reaper()
        for _ in range(2):
            w.procs.start("consume", "harness.apps:app", "--queue", "prio", "--concurrency", "8")
        publish(w.settings, [NewJob("prio", {"sleep": 0.05}) for _ in range(backlog)])
        wait_until(lambda: w.db.val("SELECT count(*) FROM test_run") >= 200, 60, "draining")
        t0 = float(w.db.val("SELECT extract(epoch FROM clock_timestamp())"))
        time.sleep(5)

        async def urgent() -> list[Any]:
            async with Client(w.settings) as c:
                out = []
                for _ in range(50):
                    out.append(await c.publish("prio", {"sleep": 0.05}, priority=5))
                    await asyncio.sleep(0.1)
                return out

        t1 = float(w.db.val("SELECT extract(epoch FROM clock_timestamp())"))
        ids = asyncio.run(urgent())
        t2 = float(w.db.val("SELECT extract(epoch FROM clock_timestamp())"))
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                                    "status = 'completed'", ids) == 50, 60, "the urgent jobs")
        waits = sorted(r["s"] for r in w.db.fetch(
            "SELECT extract(epoch FROM min(r.started_at) - j.created_at)::float8 AS s "
            "FROM jobq.job j JOIN test_run r ON r.job_id = j.id WHERE j.id = ANY($1) "
            "GROUP BY j.id, j.created_at", ids))
        before = started_between(w.db, t0, t1) / (t1 - t0)
        during = (started_between(w.db, t1, t2) - 50) / (t2 - t1)
        left = w.db.val("SELECT count(*) FROM jobq.job WHERE status = 'queued'")
        return {"backlog": backlog, "still_waiting_after": left,
                "start_after_publish_s": {"p50": round(waits[24], 3), "p99": round(waits[48], 3),
                                          "max": round(waits[-1], 3)},
                "backlog_jobs_per_s": {"before": round(before, 1), "during": round(during, 1),
                                       "ratio": round(during / before, 3)}}


def fairness(backlog: int) -> dict[str, Any]:
    with world(("fair",), "fair", PYTHONPATH=PATH) as w:  # INFO: "consumer ready"
        w.db.execute("INSERT INTO jobq.queue (name, lease_s, max_running_per_key) "
                     "VALUES ('fair', 30, 4)")
        w.procs.reaper()
        cons = [w.procs.start("consume", "harness.apps:app", "--queue", "fair",
                              "--concurrency", "8") for _ in range(2)]
        ids = [c.worker_id() for c in cons]
        peak, stop = [0], threading.Event()
        own = SyncDB(w.db_url)

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], own.val(
                    "SELECT count(*) FROM jobq.job WHERE key = 'A' AND status = 'active' "
                    "AND lease_expires_at > now()"))

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        a = publish(w.settings, [NewJob("fair", {"sleep": 0.05}, key="A")
                                 for _ in range(backlog)])
        b = publish(w.settings, [NewJob("fair", {"sleep": 0.05}, key="B") for _ in range(20)])
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                                    "status = 'completed'", b) == 20, 30, "B")
        b_s = w.db.val("SELECT extract(epoch FROM max(finished_at - created_at))::float8 "
                       "FROM jobq.job WHERE id = ANY($1)", b)
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE key = 'A' AND "
                                    "status = 'active' AND worker_id = $1", ids[0]) > 0,
                   30, "A on the first consumer")
        cons[0].signal(signal.SIGKILL)
        k0 = time.monotonic()
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE key = 'A' AND "
                                    "status = 'active' AND worker_id = $1", ids[1]) == 4,
                   30, "A's slots back")
        back = time.monotonic() - k0
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE status <> "
                                    "'completed'") == 0, 600, "everything", interval=1)
        stop.set()
        t.join(5)
        own.close()
        # at-least-once: a run that returned on the killed consumer before its
        # completion committed runs again; count those apart from any other
        twice = w.db.val("SELECT count(*) FROM (SELECT job_id FROM test_run WHERE outcome = "
                         "'returned' GROUP BY job_id HAVING count(*) > 1 "
                         "AND NOT bool_or(worker = $1)) x", ids[0])
        rerun = w.db.val("SELECT count(*) FROM (SELECT job_id FROM test_run WHERE outcome = "
                         "'returned' GROUP BY job_id HAVING count(*) > 1 "
                         "AND bool_or(worker = $1)) x", ids[0])
        return {"backlog_A": backlog, "B_slowest_publish_to_done_s": round(b_s, 3),
                "A_most_running": peak[0], "slots_back_after_sigkill_s": round(back, 2),
                "lost": len(a) + 20 - int(w.db.val(
                    "SELECT count(*) FROM jobq.job WHERE status = 'completed'")),
                "returned_twice_not_by_the_killed_consumer": twice,
                "returned_on_the_killed_consumer_and_ran_again": rerun}


def claim_cost(rounds: int = 3) -> dict[str, Any]:
    """Interleaved rounds; the medians and their ratio (one round is noisy)."""
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        for k, v in _claim_cost_once().items():
            runs.setdefault(k, []).append(v)
    med = {k: statistics.median(v) for k, v in runs.items()}
    a, b = med.values()
    return {"runs_ms": runs, "median_ms": med, "ratio": round(b / a, 3)}


def _claim_cost_once() -> dict[str, float]:
    out: dict[str, float] = {}
    for waiting, keys in ((1000, 10), (100000, 1000)):
        with scratch(("c",)) as (url, _, _):
            async def go() -> float:
                conn = await asyncpg.connect(url, server_settings=SESSION_SETTINGS)
                await conn.execute("INSERT INTO jobq.queue (name, lease_s, max_running_per_key) "
                                   "VALUES ('c', 30, 1000000)")
                await conn.execute(
                    "INSERT INTO jobq.job (queue, payload, key, published_at) "
                    "SELECT 'c', '{}', 'k' || (g % $2), now() FROM generate_series(1, $1) g",
                    waiting, keys)
                await conn.execute("ANALYZE jobq.job")
                pid = await conn.fetchval("SELECT pg_backend_pid()")
                ids = [r["id"] for r in await conn.fetch(
                    "SELECT id FROM jobq.job ORDER BY random() LIMIT 800")]  # 100 claims of 8
                cpu = 0.0
                for _ in range(5):  # CPU comes in 10 ms ticks: the same 100 claims, 5 times
                    t0 = _cpu(pid)
                    for i in range(0, len(ids), 8):
                        batch = ids[i:i + 8]
                        rows = await conn.fetch(Q["claim"], batch, "w", ["c"],
                                                [uuid.uuid4() for _ in batch])
                        await conn.fetch(Q["complete"], [r["id"] for r in rows],
                                         [r["lock"] for r in rows], [None] * len(rows))
                    cpu += _cpu(pid) - t0
                    await conn.execute("UPDATE jobq.job SET status = 'queued', "
                                       "lease_expires_at = NULL, finished_at = NULL "
                                       "WHERE id = ANY($1)", ids)  # in line again, untimed
                await conn.close()
                return cpu / 500 * 1e3  # ms per claim + completion of 8 (500 of each)

            out[f"{waiting}_waiting_over_{keys}_keys"] = round(asyncio.run(go()), 3)
    return out


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backlog", type=int, default=5000)
    p.add_argument("--skip", nargs="*", default=[], choices=("priority", "fairness", "cost"))
    a = p.parse_args()
    report: dict[str, Any] = {}
    runs: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("priority", lambda: priority(a.backlog)),
        ("fairness", lambda: fairness(a.backlog)),
        ("cost", claim_cost))
    for name, run in runs:
        if name not in a.skip:
            report[name] = run()
            print(json.dumps({name: report[name]}), flush=True)  # each as it is measured
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
