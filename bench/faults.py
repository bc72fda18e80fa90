"""Run the fault-injection suite and print its table: scenario, jobs, lost,
duplicate runs, detection latency (kill -> requeued) p50/max.

    .venv/bin/python bench/faults.py            # runs tests/e2e, ~2 minutes

Duplicate runs are handler starts beyond the one that completed the job,
counted from the database (harness/apps.py logs every start).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    env = {**os.environ, "JOBQ_TEST_FAULT_REPORT": path}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/e2e", *sys.argv[1:]], cwd=ROOT, env=env)
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    os.unlink(path)
    print()
    print("| scenario | jobs | lost | duplicate runs | detection p50 | detection max |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        lat = r["latencies"]
        p50 = f"{statistics.median(lat):.2f} s" if lat else "—"
        mx = f"{max(lat):.2f} s" if lat else "—"
        print(f"| {r['scenario']} | {r['jobs']} | {r['lost']} | {r['duplicate_runs']} "
              f"| {p50} | {mx} |")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
