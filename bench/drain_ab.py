"""Drain throughput of two builds in one sitting, interleaved (issue #11:
the consumer's restructuring must keep drain within noise).

    .venv/bin/python bench/drain_ab.py --before /path/to/old/services [--rounds 3]

A backlog of --jobs no-op jobs is drained by 2 consumer processes of
concurrency 32 from the build under test; the other build runs next, and so
on for --rounds. The producer side (filling the backlog) is this checkout's;
only the consumers differ. Each build's database is made by its own
`jobq migrate` (its schema and its statement functions), so a change of
SQL is measured too. Rates from the database clock, as bench/run.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world
from run import CONCURRENCY, db_rate, reset

from harness.helpers import wait_until


def drain(w: Any, n: int, consumers: int) -> float:
    """run.drain, with the backlog made by plain SQL that every build's
    schema takes (enqueue_many's first five arguments) and published by that
    build's reaper before its consumers start."""
    drain_backlog_published(w, n)
    started = [w.procs.start("consume", "noop_app:app", "--concurrency", str(CONCURRENCY))
               for _ in range(consumers)]
    wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
               == n, 600, "backlog drained", interval=0.2)
    for p in started:
        p.kill()
    return db_rate(w.db, "started_at")


def drain_backlog_published(w: Any, n: int) -> None:
    """n no-op jobs in the queue and in the broker, nobody consuming."""
    w.db.execute("SELECT jobq.enqueue_many(array_fill('noop'::text, ARRAY[$1::int]), "
                 "array_fill('{}'::jsonb, ARRAY[$1::int]), array_fill(0::float8, ARRAY[$1::int]),"
                 " array_fill(NULL::text, ARRAY[$1::int]), 0)", n)
    reaper = w.procs.reaper()
    wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE published_at IS NULL")
               == 0, 120, "the backlog published", interval=0.2)
    reaper.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", required=True, help="services/ folder of the older build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20000)
    a = p.parse_args()
    builds = {"before": a.before, "after": str(HERE.parent / "services")}
    rates: dict[str, list[float]] = {k: [] for k in builds}
    for _ in range(a.rounds):
        for name, services in builds.items():
            path = os.pathsep.join([services, str(HERE), str(HERE.parent)])
            with world(("noop",), "ab", migrate_with=services, JOBQ_LOG_LEVEL="WARNING",
                       PYTHONPATH=path) as w:
                reset(w.db, True, w.settings)
                rates[name].append(round(drain(w, a.jobs, 2), 1))
    ratios = [x / y for x, y in zip(rates["after"], rates["before"], strict=True)]
    print(json.dumps({"jobs": a.jobs, "consumers": 2, "rates_jobs_per_s": rates,
                      "after_over_before_per_round": [round(r, 3) for r in ratios],
                      "median_ratio": round(statistics.median(ratios), 3)}, indent=2))


if __name__ == "__main__":
    main()
