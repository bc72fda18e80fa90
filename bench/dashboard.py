"""What one dashboard page load costs on a 1 M-row job table (issue #18).

Fills jobq.job with --rows rows (95 % completed over the last day, 3 %
failed, 1.5 % queued, the rest active, a tenth of those stalled) with plain
SQL, then times each dashboard statement (median of --repeat runs, server
side, EXPLAIN ANALYZE's execution time) and whole pages over HTTP from a
running `jobq dashboard`. Also the old jobq.queue_stats view the CLI's
stats verb reads, for comparison: it reads the whole table.

    .venv/bin/python bench/dashboard.py [--rows 1000000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world

from harness.helpers import free_port, wait_http
from jobq.sql import Q

FILL = """
INSERT INTO jobq.queue (name) SELECT 'q' || i FROM generate_series(1, 8) i ON CONFLICT DO NOTHING;
INSERT INTO jobq.job (queue, payload, status, attempts, run_at, created_at, started_at,
                      finished_at, lease_expires_at, lock, worker_id, last_error)
SELECT 'q' || (1 + i % 8), '{"n": 1}',
       CASE WHEN i % 1000 < 950 THEN 'completed' WHEN i % 1000 < 980 THEN 'failed'
            WHEN i % 1000 < 995 THEN 'queued' ELSE 'active' END,
       1, now() - (i % 86400) * interval '1 second', now() - (i % 86400) * interval '1 second',
       now() - (i % 86400) * interval '1 second',
       CASE WHEN i % 1000 < 980 THEN now() - (i % 86400) * interval '1 second' END,
       CASE WHEN i % 1000 >= 995 THEN now() + CASE WHEN i % 10 = 0 THEN interval '-5 s'
                                                   ELSE interval '30 s' END END,
       gen_random_uuid(), 'w' || (i % 20),
       CASE WHEN i % 1000 BETWEEN 950 AND 979 THEN 'boom' END
FROM generate_series(1, $1) i;
"""

STATEMENTS = {"dash_queues": (), "dash_throughput": (), "dash_running": (200,),
              "dash_stalled": (200,), "dash_failed": (200,), "dash_workers": (),
              "dash_reapers": (), "stats (jobq.queue_stats)": ()}
PAGES = ["/", "/running", "/stalled", "/failed", "/workers"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=15)
    a = p.parse_args()
    out: dict[str, object] = {"rows": a.rows}
    with world(("q1",), "dash", JOBQ_LOG_LEVEL="WARNING") as w:
        t0 = time.monotonic()
        for stmt in FILL.strip().split(";\n"):
            w.db.execute(stmt, a.rows) if "$1" in stmt else w.db.execute(stmt)
        w.db.execute("VACUUM ANALYZE jobq.job")
        out["fill_s"] = round(time.monotonic() - t0, 1)
        ms: dict[str, float] = {}
        for name, args in STATEMENTS.items():
            sql = Q[name.split(" ")[0]]
            runs = []
            w.db.execute("SET jit = off")  # as every jobq session (db.SESSION_SETTINGS)
            for _ in range(a.repeat):
                plan = w.db.val(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
                plan = json.loads(plan) if isinstance(plan, str) else plan
                runs.append(plan[0]["Execution Time"])
            ms[name] = round(statistics.median(runs), 2)
        out["statement_ms_median"] = ms
        port = free_port()
        w.procs.start("dashboard", "--port", str(port), "--refresh", "0")
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/workers", 30, "the dashboard")
        pages: dict[str, float] = {}
        for path in PAGES:
            runs = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=30) as r:
                    r.read()
                runs.append((time.perf_counter() - t) * 1000)
            pages[path] = round(statistics.median(runs), 1)
        out["page_ms_median"] = pages
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
