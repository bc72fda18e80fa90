"""What a fleet-wide limit costs on the hot path (issue #17): drain
throughput of a no-op backlog with no limit, with a limit that never binds
(max_running far above the concurrency: the claim's queue-row lock and
count), and with one that binds (max_running = 16 of 2 x 32 slots: parking,
and consumers publishing a parked job as each slot frees). Interleaved
rounds, one reaper running in every phase, rates from the database clock.

    .venv/bin/python bench/limits.py [--jobs 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world
from run import CONCURRENCY, drain, reset

PHASES = {"no limit": None, "max_running 100000 (never binds)": 100000,
          "max_running 16 (binds)": 16}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    rates: dict[str, list[float]] = {k: [] for k in PHASES}
    import os

    path = os.pathsep.join([str(HERE.parent / "services"), str(HERE), str(HERE.parent)])
    with world(("noop",), "limits", JOBQ_LOG_LEVEL="WARNING", PYTHONPATH=path) as w:
        w.procs.reaper()
        for _ in range(a.rounds):
            for name, limit in PHASES.items():
                reset(w.db, True, w.settings)
                w.db.execute("UPDATE jobq.queue SET max_running = $1 WHERE name = 'noop'", limit)
                rates[name].append(round(drain(w.db, w.procs, w.settings, a.jobs, 2), 1))
    base = statistics.median(rates["no limit"])
    print(json.dumps({"jobs": a.jobs, "consumers": 2, "concurrency": CONCURRENCY,
                      "rates_jobs_per_s": rates,
                      "median_over_no_limit": {k: round(statistics.median(v) / base, 3)
                                               for k, v in rates.items()}}, indent=2))


if __name__ == "__main__":
    main()
