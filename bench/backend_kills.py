"""Claim latency at baseline and while the consumer's database backends are
terminated twice a second (issue #19): the kind of thing a failover, a pooler
restart or an idle-connection killer does.

A producer publishes single jobs (1 ms handlers; each tick's publishes
concurrent, as a web app's requests are) at a steady rate into one
consumer of concurrency 16 with a 30 s lease; for each job, publish -> claim
is `started_at - created_at` on the database clock. Also: stalls or suspect
marks charged (jobq's own errors must cost none), the slowest claim ->
completion (a job left to its lease would take 30 s), jobs run twice.

    .venv/bin/python bench/backend_kills.py [--seconds 20] [--rate 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchenv import world
from detection import pct

from harness.helpers import set_queue, wait_until
from harness.load import kill_backends, produce


def measure(kill: bool, seconds: float, rate: float) -> dict[str, Any]:
    with world(("work",), "kills") as w:
        set_queue(w.db, "work", lease_s=30)
        w.procs.reaper()
        w.procs.consumer("--concurrency", "16").worker_id()
        ids: list[Any] = []
        stop, kills, reached = threading.Event(), [0], [0.0]
        threads = [threading.Thread(target=lambda: reached.__setitem__(
            0, produce(w.settings, rate, seconds, ids)))]
        if kill:
            threads.append(threading.Thread(target=lambda: kills.__setitem__(
                0, kill_backends(w.db_url, "jobq-consumer%", 0.5, stop))))
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
        return {"jobs": len(ids), "reached_jobs_per_s": round(reached[0], 1),
                "backends_killed": kills[0],
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
