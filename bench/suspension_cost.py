"""What suspension costs (issue #52's figures), three trials on a fresh
database each (benchenv.scratch), one reaper and ``jobq consume
bench.suspension_app:app`` consumers (concurrency 16):

1. **Recorded step overhead**: jobs of 20 no-op ``job.step`` calls each, a
   sync function (run in a thread, as job.step runs one) and a coroutine
   function; each call's time around ``job.step`` (a lookup that misses, the
   call, the fenced record: two statements, the record a commit), p50/p99/max
   over every call of every job. One job at a time (1 consumer,
   concurrency 1, ``--step-jobs``/4 jobs), then ``--step-jobs`` jobs on 2
   consumers of concurrency 16 (32 jobs stepping at once).
2. **Sleeping jobs between wakes**: the database's transactions, tuples
   read and blocks read or hit a second (``pg_stat_database`` of the scratch
   database) over ``--window`` s with the fleet idle and no job, then over
   the same window with ``--sleepers`` jobs suspended in ``job.sleep`` for an
   hour, just after they suspended (their rows' dead versions still in the
   indexes) and after a VACUUM (what autovacuum leaves during a long sleep):
   what they cost while nobody wakes.
3. **Sleep overshoot across SIGKILL**: ``--overshoot-jobs`` jobs sleep
   ``--nap`` s; once all are suspended, every consumer and the reaper are
   SIGKILLed and started again. Overshoot = the run after the wake's start
   (started_at, the database clock) minus the sleep's deadline (its step's
   ``until``), p50/p99/max over every job.

    .venv/bin/python bench/suspension_cost.py [--step-jobs 100] [--sleepers 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import scratch
from detection import pct

from harness.helpers import Procs, SyncDB, set_queue

APP = "bench.suspension_app:app"


@contextmanager
def fleet(queue: str) -> Iterator[tuple[SyncDB, Procs, Callable[..., None]]]:
    """The scratch database, its processes, and how to start one consumer."""
    with scratch((queue,)) as (db_url, amqp_url, namespace):
        db = SyncDB(db_url)
        set_queue(db, queue, lease_s=5)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
        env.update({"JOBQ_DATABASE_URL": db_url, "JOBQ_AMQP_URL": amqp_url,
                    "JOBQ_NAMESPACE": namespace,
                    "PYTHONPATH": str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")})
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-suspension-cost-")))

        def consumer(concurrency: int = 16) -> None:
            procs.start("consume", APP, "--queue", queue,
                        "--concurrency", str(concurrency)).worker_id()
        try:
            yield db, procs, consumer
        finally:
            procs.close()
            db.close()


def _until(db: SyncDB, sql: str, want: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while db.val(sql) < want:
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not within {timeout:.0f} s")
        time.sleep(0.2)


def step_overhead(jobs: int, consumers: int, concurrency: int) -> dict[str, Any]:
    out: dict[str, Any] = {"consumers": consumers, "concurrency": concurrency}
    with fleet("steps") as (db, procs, consumer):
        procs.reaper()
        for _ in range(consumers):
            consumer(concurrency)
        for kind in ("sync", "async"):
            db.execute("SELECT jobq.enqueue('steps', jsonb_build_object('n', 20, 'async', "
                       "$1::bool)) FROM generate_series(1, $2)", kind == "async", jobs)
            _until(db, "SELECT count(*) FROM jobq.job WHERE status = 'completed'",
                   jobs * (1 + (kind == "async")), 300, f"{kind} step jobs")
            took = sorted(float(t) for r in db.fetch(
                "SELECT result FROM jobq.job WHERE status = 'completed' "
                "AND (payload->>'async')::bool = $1", kind == "async")
                for t in json.loads(r["result"]))
            out[kind] = {"calls": len(took), "p50_ms": round(pct(took, 0.5), 2),
                         "p99_ms": round(pct(took, 0.99), 2), "max_ms": round(took[-1], 2)}
    return out


def _rates(db: SyncDB, window: float) -> dict[str, float]:
    sql = ("SELECT xact_commit + xact_rollback AS xacts, tup_returned + tup_fetched AS tuples, "
           "blks_hit + blks_read AS blocks FROM pg_stat_database WHERE datname = "
           "current_database()")
    db.execute("SELECT pg_stat_clear_snapshot()")
    a = db.fetchrow(sql)
    time.sleep(window)
    db.execute("SELECT pg_stat_clear_snapshot()")
    b = db.fetchrow(sql)
    return {k: round((b[k] - a[k]) / window, 1) for k in ("xacts", "tuples", "blocks")}


def sleepers_cost(sleepers: int, window: float) -> dict[str, Any]:
    with fleet("sleeps") as (db, procs, consumer):
        procs.reaper()
        consumer()
        consumer()
        time.sleep(5)  # start-up settled
        idle = _rates(db, window)
        db.execute("SELECT jobq.enqueue('sleeps', '{\"s\": 3600}') FROM generate_series(1, $1)",
                   sleepers)
        _until(db, "SELECT count(*) FROM jobq.job WHERE suspended_at IS NOT NULL "
               "AND status = 'queued'", sleepers, 600, "every sleeper suspended")
        time.sleep(5)  # the last suspensions' own writes done
        fresh = _rates(db, window)
        db.execute("VACUUM jobq.job")  # what autovacuum leaves in an hour's sleep
        time.sleep(2)
        settled = _rates(db, window)
        return {"sleepers": sleepers, "window_s": window, "per_s_idle": idle,
                "per_s_sleepers_fresh": fresh, "per_s_sleepers_vacuumed": settled}


def overshoot(jobs: int, nap: float) -> dict[str, Any]:
    with fleet("sleeps") as (db, procs, consumer):
        procs.reaper()
        consumer()
        consumer()
        db.execute("SELECT jobq.enqueue('sleeps', jsonb_build_object('s', $1::float8)) "
                   "FROM generate_series(1, $2)", nap, jobs)
        _until(db, "SELECT count(*) FROM jobq.job WHERE suspended_at IS NOT NULL", jobs, 60,
               "every job suspended")
        for p in procs.procs:  # the consumers and the reaper, mid-sleep
            p.kill()
        killed_at = db.val("SELECT now()")
        procs.reaper()
        consumer()
        consumer()
        _until(db, "SELECT count(*) FROM jobq.job WHERE status = 'completed'", jobs, 120,
               "every sleeper completed")
        over = sorted(float(r["s"]) for r in db.fetch(
            "SELECT extract(epoch FROM j.started_at - to_timestamp((s.result->>'until')::float8))"
            " AS s FROM jobq.job j JOIN jobq.job_step s "
            "ON s.job_id = j.id AND s.name = 'sleep:nap'"))
        first_deadline = db.val("SELECT min(to_timestamp((result->>'until')::float8)) "
                                "FROM jobq.job_step WHERE name = 'sleep:nap'")
        return {"jobs": jobs, "nap_s": nap,
                "killed_before_first_deadline_s": round(
                    (first_deadline - killed_at).total_seconds(), 2),
                "overshoot_s_p50": round(pct(over, 0.5), 3),
                "overshoot_s_p99": round(pct(over, 0.99), 3), "overshoot_s_max": round(over[-1], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step-jobs", type=int, default=100)
    ap.add_argument("--sleepers", type=int, default=10000)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--overshoot-jobs", type=int, default=100)
    ap.add_argument("--nap", type=float, default=8.0)
    args = ap.parse_args()
    print({"step_overhead": step_overhead(args.step_jobs // 4, 1, 1)}, flush=True)
    print({"step_overhead": step_overhead(args.step_jobs, 2, 16)}, flush=True)
    print({"sleeping": sleepers_cost(args.sleepers, args.window)}, flush=True)
    print({"overshoot": overshoot(args.overshoot_jobs, args.nap)}, flush=True)


if __name__ == "__main__":
    main()
