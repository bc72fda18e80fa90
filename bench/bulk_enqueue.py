"""Bulk enqueue against pgqueuer's (issue #37), in one sitting:

    .venv/bin/python bench/bulk_enqueue.py [--jobs 20000] [--runs 3]

Per run, interleaved, one producer process each, batches of 100 one after
the other (the issue's shape):

- pgqueuer 1.6: ``Queries.enqueue`` of lists; the jobs are durable rows.
- jobq ``publish_many``: rows committed, then one confirmed message per id
  from the producer (the wire format: the id as the body).
- jobq ``publish_many(relay=True)``: rows committed and the call returns;
  the reaper's relay (one reaper, running throughout) publishes the ids.
  Two figures: the call's rate (the jobs are durable rows, pgqueuer's
  promise) and the relay's, every id confirmed by the broker (the last
  ``published_at``, timed from the producer's start).
- the broker's own limit: raw confirmed persistent messages to a quorum
  queue, 100 in flight (``publish_path.broker_limit``).

``--backfill N`` instead: N jobs in batches of 1,000 with 2 consumers and a
reaper running, direct and with ``relay=True``: when the producer is done
and when the last job completed.

PostgreSQL and RabbitMQ CPU per job over each producer's window (/proc).
Ratios within each run, then their median. No consumers: this is the
enqueue side; the relay's publishes land in the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import scratch, service_env, world
from peers import PY, VENV, ensure_venv
from publish_path import broker_limit, measure, run_json

from harness.helpers import wait_until
from jobq.client.producer import Client
from jobq.newjob import NewJob


def pgqueuer(n: int) -> dict[str, float]:
    import subprocess
    with scratch(queues=()) as (db_url, _amqp, _ns):
        env = {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url,
               "PYTHONPATH": str(HERE)}
        subprocess.run([str(VENV / "bin" / "pgq"), "install"], env=env, check=True, cwd=HERE,
                       stdout=subprocess.DEVNULL)
        got = measure(n, lambda: run_json([str(PY), str(HERE / "peer_pgqueuer.py"), "produce",
                                           str(n)], env), set(), None)
    return {f"pgqueuer_{k}": v for k, v in got.items()}


def jobq(n: int) -> dict[str, float]:
    res: dict[str, float] = {}
    with world(("noop",), "bulk", JOBQ_LOG_LEVEL="WARNING") as w:
        w.db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('noop', 30)")
        env = service_env(w.db_url, w.amqp_url, w.settings.namespace, JOBQ_LOG_LEVEL="WARNING")
        producer = [sys.executable, str(HERE / "producer_jobq.py"), str(n), "1", "100"]
        w.procs.reaper()  # throughout: the relay's, and the direct path's fallback
        for key, extra in (("jobq_direct", []), ("jobq_relay", ["relay"])):
            w.db.execute("TRUNCATE jobq.job, jobq.job_event CASCADE")
            t0 = [0.0]

            def produce(extra: list[str] = extra) -> dict[str, float]:
                out = run_json([*producer, *extra], env)
                t0[0] = out["t0"]
                return out

            got = measure(n, produce, set(), None)
            res.update({f"{key}_{k}": v for k, v in got.items()})
            wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job "
                                        "WHERE published_at IS NULL") == 0,
                       300, "every id published", interval=0.1)
            last = float(w.db.val("SELECT extract(epoch FROM max(published_at)) FROM jobq.job"))
            res[f"{key}_on_broker_rate"] = n / (last - t0[0])
    return res


def backfill(n: int) -> dict[str, float]:
    """A backfill end to end: n jobs in batches of 1,000 from one producer
    while 2 consumers (concurrency 32) and a reaper run; seconds until the
    producer is done, and until every job completed (database clock)."""
    res: dict[str, float] = {}
    for key, relay in (("direct", False), ("relay", True)):
        with world(("noop",), f"backfill-{key}", JOBQ_LOG_LEVEL="WARNING",
                   PYTHONPATH=f"{HERE}{os.pathsep}{HERE.parent}") as w:
            w.db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('noop', 30)")
            w.procs.reaper()
            for _ in range(2):
                w.procs.start("consume", "noop_app:app", "--concurrency", "32")
            wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.worker") == 2, 60,
                       "2 consumers up", interval=0.1)

            async def fill() -> None:
                async with Client(w.settings) as c:
                    for i in range(0, n, 1000):
                        await c.publish_many([NewJob("noop", {})
                                              for _ in range(min(1000, n - i))], relay=relay)

            t0 = float(w.db.val("SELECT extract(epoch FROM now())"))
            asyncio.run(fill())
            t1 = float(w.db.val("SELECT extract(epoch FROM now())"))
            wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job "
                                        "WHERE status = 'completed'") == n,
                       600, "every job completed", interval=0.2)
            last = float(w.db.val("SELECT extract(epoch FROM max(finished_at)) FROM jobq.job"))
            res[f"backfill_{key}_enqueue_s"] = t1 - t0
            res[f"backfill_{key}_done_s"] = last - t0
    return res


def one_run(n: int) -> dict[str, float]:
    r: dict[str, float] = {}
    r.update(pgqueuer(n))
    r.update(jobq(n))
    r.update(broker_limit(n))
    r["relay_vs_pgqueuer"] = r["jobq_relay_enqueue_rate"] / r["pgqueuer_enqueue_rate"]
    r["direct_vs_pgqueuer"] = r["jobq_direct_enqueue_rate"] / r["pgqueuer_enqueue_rate"]
    r["relay_on_broker_vs_limit"] = (r["jobq_relay_on_broker_rate"]
                                     / r["broker_raw_confirmed_per_s"])
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backfill", type=int, default=0, metavar="N",
                    help="instead: N jobs end to end with consumers running, direct and relay")
    args = ap.parse_args()
    if args.backfill:
        for k, v in sorted(backfill(args.backfill).items()):
            print(f"  {k:32s} {v:10.2f}", flush=True)
        return
    ensure_venv()
    print(f"bulk enqueue, batches of 100, {args.jobs} jobs, {args.runs} runs, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores", flush=True)
    runs = []
    for i in range(args.runs):
        r = one_run(args.jobs)
        runs.append(r)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:,.3f}" for k, v in sorted(r.items())),
              flush=True)
    print("\nmedian over runs:")
    for k in sorted(runs[0]):
        vals = [r[k] for r in runs if k in r]
        print(f"  {k:40s} {statistics.median(vals):12,.3f}   "
              f"({', '.join(f'{v:,.3f}' for v in vals)})")


if __name__ == "__main__":
    main()
