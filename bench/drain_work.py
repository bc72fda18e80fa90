"""Where a drain's database work goes (issue #49): a backlog of --jobs no-op
jobs drained by 2 consumers, and what PostgreSQL did for them.

    BENCH_CONCURRENCY=16 .venv/bin/python bench/drain_work.py [--jobs 20000]

The backlog is made and published first (a reaper, then stopped), the
statistics reset, then 2 ``jobq consume`` of BENCH_CONCURRENCY (default 32)
drain it. Printed: the drain rate (database clock), each jobq function's
calls, jobs per call and time per job (pg_stat_user_functions, with
track_functions = all on the scratch database), commits per job, jobq.job's
updates and how many were HOT, the buffers each of its indexes took per job,
and the WAL records and bytes per job (pg_stat_wal: the whole server, so run
it with nothing else on the machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world
from drain_ab import drain_backlog_published
from run import CONCURRENCY, db_rate, reset

from harness.helpers import SyncDB, wait_until

FUNCTIONS = ("SELECT funcname, calls, total_time FROM pg_stat_user_functions "
             "WHERE schemaname = 'jobq' ORDER BY calls DESC")
INDEXES = ("SELECT indexrelname, idx_blks_hit + idx_blks_read AS blks FROM pg_statio_user_indexes "
           "WHERE relid = 'jobq.job'::regclass ORDER BY 2 DESC LIMIT 6")


def report(db: SyncDB, n: int, rate: float) -> dict[str, object]:
    fns = {r["funcname"]: {"calls": r["calls"], "jobs_per_call": round(n / r["calls"], 2),
                           "ms_per_job": round(r["total_time"] / n, 4)}
           for r in db.fetch(FUNCTIONS) if r["calls"] > 2}
    table = db.fetch("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                     "WHERE relid = 'jobq.job'::regclass")[0]
    wal = db.fetch("SELECT wal_records, wal_bytes FROM pg_stat_wal")[0]
    commits = db.val("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    return {"jobs": n, "consumers": 2, "concurrency": CONCURRENCY, "jobs_per_s": round(rate),
            "functions": fns, "commits_per_job": round(commits / n, 3),
            "job_updates_per_job": round(table["n_tup_upd"] / n, 2),
            "hot_updates_per_job": round(table["n_tup_hot_upd"] / n, 2),
            "index_buffers_per_job": {r["indexrelname"]: round(r["blks"] / n, 2)
                                      for r in db.fetch(INDEXES)},
            "wal_records_per_job": round(wal["wal_records"] / n, 1),
            "wal_bytes_per_job": round(float(wal["wal_bytes"]) / n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20000)
    n = ap.parse_args().jobs
    path = f"{HERE.parent / 'services'}:{HERE}:{HERE.parent}"
    with world(("noop",), "work", JOBQ_LOG_LEVEL="WARNING", PYTHONPATH=path) as w:
        reset(w.db, True, w.settings)
        w.db.execute(f"ALTER DATABASE {w.db_url.rsplit('/', 1)[1]} SET track_functions = 'all'")
        drain_backlog_published(w, n)
        w.db.execute("SELECT pg_stat_reset()")
        w.db.execute("SELECT pg_stat_reset_shared('wal')")
        time.sleep(0.6)  # the reset reaches the statistics views
        started = [w.procs.start("consume", "noop_app:app", "--concurrency", str(CONCURRENCY))
                   for _ in range(2)]
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
                   == n, 300, "backlog drained", interval=0.2)
        rate = db_rate(w.db, "started_at")
        for p in started:
            p.kill()
        time.sleep(0.6)  # the consumers' last statistics reach the views
        print(json.dumps(report(w.db, n, rate), indent=2))


if __name__ == "__main__":
    main()
