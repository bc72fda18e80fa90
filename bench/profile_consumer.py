"""Where a consumer's CPU goes on a drain (issue #49, item 3), by py-spy.

    .venv/bin/python bench/profile_consumer.py [--jobs 20000] [--top 25]

A backlog of --jobs no-op jobs (published by a reaper, then stopped) is
drained by two `jobq consume noop_app:app` processes of concurrency 32;
py-spy samples the first one at 250 Hz for the whole drain (idle frames
dropped). Prints the drain rate, the consumer's CPU per job (from /proc),
and the top functions by own samples and by samples inclusive (a function
counted once per stack), as shares of all samples. py-spy needs ptrace: run
as root or with CAP_SYS_PTRACE.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world
from drain_ab import drain_backlog_published
from run import CONCURRENCY, db_rate, reset

from harness.helpers import wait_until


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def frames(raw: Path) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """py-spy's raw (collapsed) stacks: total samples, own and inclusive."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        names = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1]
                 if " (" in f else f for f in stack.split(";")[1:]]  # drop the thread
        if not names:
            continue
        total += n
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
    return total, own, inclusive


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--keep", type=Path, help="also write py-spy's raw stacks here")
    a = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(tempfile.mkdtemp()) / "consumer.txt"
    path = os.pathsep.join([str(HERE.parent / "services"), str(HERE), str(HERE.parent)])
    with world(("noop",), "prof", JOBQ_LOG_LEVEL="WARNING", PYTHONPATH=path) as w:
        reset(w.db, True, w.settings)
        drain_backlog_published(w, a.jobs)
        started = [w.procs.start("consume", "noop_app:app", "--concurrency", str(CONCURRENCY))
                   for _ in range(2)]
        pid = started[0].pid
        # Past start-up (imports, connections, the first claims): the drain only.
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE status = "
                                    "'completed'") >= a.jobs // 20, 120, "the drain going")
        ran = ("SELECT count(*) FROM jobq.job j JOIN jobq.worker w ON w.worker_id = j.worker_id "
               "WHERE w.pid = $1 AND j.status = 'completed'")
        before, done_before = cpu_s(pid), w.db.val(ran, pid)
        sampler = subprocess.Popen([spy, "record", "-p", str(pid), "-r", "250", "-f", "raw",
                                    "-o", str(out), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until(lambda: w.db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
                   == a.jobs, 600, "backlog drained", interval=0.2)
        used = cpu_s(pid) - before
        mine = w.db.val(ran, pid) - done_before
        sampler.send_signal(signal.SIGINT)  # py-spy writes its file on an interrupt
        _, err = sampler.communicate(timeout=60)
        if not out.exists():
            raise SystemExit(f"py-spy wrote nothing: {err.decode()[-500:]}")
        for c in started:
            c.kill()
        rate = db_rate(w.db, "started_at")
    if a.keep:
        shutil.copy(out, a.keep)
    total, own, inclusive = frames(out)
    print(f"drain of {a.jobs} no-op jobs, 2 consumers x c{CONCURRENCY}: {rate:,.0f} jobs/s; "
          f"after start-up the profiled consumer ran {mine} jobs on {used:.2f} s CPU = "
          f"{1000 * used / max(mine, 1):.3f} ms a job; {total} samples (250 Hz, active only)")
    for title, counts in (("own", own), ("inclusive", inclusive)):
        print(f"\ntop {a.top} by {title} samples:")
        for name, n in counts.most_common(a.top):
            print(f"  {100 * n / total:5.1f} %  {name}")


if __name__ == "__main__":
    main()
