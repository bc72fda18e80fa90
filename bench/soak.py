"""Soak: thousands of jobs while consumers are SIGKILLed and restarted every
few seconds and reapers now and then. Prints its figures; exits non-zero if a
job was lost or handlers re-ran more often than kills can explain.

    .venv/bin/python bench/soak.py --jobs 5000 --kill-every 3

Each handler start is logged in test_run (harness/apps.py), so re-runs are
counted from the database: re-runs must not exceed the number of jobs that
were active in a consumer at the moment it was killed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness.soak import soak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--consumers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--lease", type=float, default=2.0)
    p.add_argument("--kill-every", type=float, default=3.0)
    p.add_argument("--max-sleep", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args()
    from benchenv import scratch

    with scratch(queues=("work",)) as (db_url, amqp_url, namespace):
        result = soak(db_url, amqp_url, namespace, jobs=a.jobs, consumers=a.consumers,
                      concurrency=a.concurrency, lease_s=a.lease, kill_every_s=a.kill_every,
                      max_sleep_s=a.max_sleep, seed=a.seed)
    print(json.dumps(result, indent=2))
    ok = result["lost"] == 0 and result["reruns"] <= result["in_flight_at_kills"]
    print("OK" if ok else "FAILED: lost jobs or unexplained re-runs")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
