"""Detection and recovery figures (issues #6, #12), 30 s lease, default settings.

The hard case only: every run of a job takes as long as its first (5 s; no
`sleep_first`, which once hid that recovery was serialised), several jobs per
process, and figures over *all* jobs (p50 / p99 / max), on the database clock.

- SIGKILL of a consumer holding N = 1, 8, 32 jobs, one idle spare of
  concurrency N -> every job running again; target p99 <= vanished_grace_s + 1 s.
- SIGSTOP of a consumer -> jobs requeued (no fast path: the lease decides).
- one poison job among 7 healthy ones (2 s every run) in a consumer of
  concurrency 8: time until the poison fails, the healthy ones' re-runs.
- --pool process: a handler SIGKILLs its own child -> the job running again.
- CPU-bound sync handlers, 1 and 2 consumers: thread pool vs process pool.

    .venv/bin/python bench/detection.py --trials 3 --stops 20
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchenv import world

from harness.helpers import Procs, SyncDB, publish, set_queue, wait_until
from harness.load import rerun_latencies
from jobq.settings import Settings


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_s": round(statistics.median(values), 2),
            "p99_s": round(pct(values, 0.99), 2), "max_s": round(max(values), 2)}


def kills(db: SyncDB, procs: Procs, settings: Settings, n: int, trials: int) -> dict[str, Any]:
    """Each trial: consumer A runs n jobs of 5 s, an idle spare of concurrency
    n stands by, A is SIGKILLed; kill -> each job running again."""
    set_queue(db, "work", lease_s=30, vanished_grace_s=2)
    running: list[float] = []
    charged = 0
    for _ in range(trials):
        a = procs.consumer("--concurrency", str(n))
        a.worker_id()
        ids = publish(settings, "work", [{"sleep": 5} for _ in range(n)])
        wait_until(lambda: db.val("SELECT count(DISTINCT job_id) FROM test_run "
                                  "WHERE job_id = ANY($1)", ids) == n, 20, "all running in A")
        b = procs.consumer("--concurrency", str(n))
        b.worker_id()
        a.kill()
        killed_at = db.val("SELECT clock_timestamp()")
        wait_until(lambda: len(rerun_latencies(db, ids, killed_at)) == n, 60, "rerun",
                   interval=0.02)
        running += rerun_latencies(db, ids, killed_at)
        wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                                  "status = 'completed'", ids) == n, 60, "completion")
        charged += db.val("SELECT sum(stalls)::int FROM jobq.job WHERE id = ANY($1)", ids)
        b.kill()
    return {"jobs_per_kill": n, "trials": trials, "kill_to_running_again": summary(running),
            "stalls_charged": charged}


def stops(db: SyncDB, procs: Procs, settings: Settings, trials: int,
          parallel: int) -> dict[str, Any]:
    lease_s = 30.0
    set_queue(db, "work", lease_s=lease_s, vanished_grace_s=2)
    latencies: list[float] = []
    while len(latencies) < trials:
        n = min(parallel, trials - len(latencies))
        frozen = [procs.consumer("--concurrency", "1") for _ in range(n)]
        for p in frozen:
            p.worker_id()
        ids = publish(settings, "work", [{"sleep_first": 600} for _ in range(n)])
        wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)",
                                  ids) == n, 15, "jobs running")
        t0 = time.monotonic()
        for p in frozen:
            p.signal(signal.SIGSTOP)
        pending = set(ids)
        while pending:
            done = {r["id"] for r in db.fetch(
                "SELECT id FROM jobq.job WHERE id = ANY($1) AND stalls + suspect_stalls > 0",
                list(pending))}
            for _ in done:
                latencies.append(time.monotonic() - t0)
            pending -= done
            assert time.monotonic() - t0 < lease_s + 30, "not requeued"
            time.sleep(0.01)
        for p in frozen:
            p.kill()
        db.execute("UPDATE jobq.job SET status = 'cancelled' WHERE id = ANY($1)", ids)
    return {"sigstop_to_requeued": summary(latencies), "lease_s": lease_s}


def poison(db: SyncDB, procs: Procs, settings: Settings) -> dict[str, Any]:
    max_stalls = 3
    set_queue(db, "work", lease_s=30, vanished_grace_s=2, max_stalls=max_stalls,
              stall_cooldown_s=1)
    db.execute("DELETE FROM jobq.job")
    first = procs.consumer("--concurrency", "8")
    first.worker_id()
    healthy = publish(settings, "work", [{"sleep": 2} for _ in range(7)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)",
                              healthy) == 7, 10, "7 healthy running")
    (bad,) = publish(settings, "work", [{"kill_on_attempt": 999}])
    t0 = time.monotonic()
    fleet = [first]
    while db.val("SELECT status FROM jobq.job WHERE id = $1", bad) != "failed" or db.val(
            "SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status <> 'completed'",
            healthy):
        assert time.monotonic() - t0 < 180
        fleet = [c for c in fleet if c.alive()]
        while len(fleet) < 2:  # an orchestrator restarts what died
            fleet.append(procs.consumer("--concurrency", "8"))
        time.sleep(0.05)
    row = db.fetchrow("SELECT stalls, suspect_stalls FROM jobq.job WHERE id = $1", bad)
    h = db.fetch("SELECT j.status, j.stalls, (SELECT count(*) FROM test_run r "
                 "WHERE r.job_id = j.id) AS runs FROM jobq.job j WHERE j.id = ANY($1)", healthy)
    for p in fleet:
        p.kill()
    return {"poison_stalls": row["stalls"], "poison_suspect_stalls": row["suspect_stalls"],
            "seconds_to_fail": round(time.monotonic() - t0, 1),
            "healthy_completed": sum(r["status"] == "completed" for r in h),
            "healthy_max_stalls": max(r["stalls"] for r in h),
            "healthy_max_reruns": max(r["runs"] for r in h) - 1,
            "rerun_bound": max_stalls + 2}


def child_deaths(db: SyncDB, procs: Procs, settings: Settings, trials: int) -> dict[str, Any]:
    """--pool process: a handler SIGKILLs its own child -> running again."""
    set_queue(db, "proc", lease_s=30)
    c = procs.consumer("--queue", "proc", "--pool", "process", "--concurrency", "4")
    c.worker_id()
    again = []
    for _ in range(trials):
        (jid,) = publish(settings, "proc", [{"kill_self_on_attempt": 1}])
        wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid)
                   == "completed", 20, "re-run")
        again.append(db.val("SELECT extract(epoch FROM max(started_at) - min(started_at))::float8 "
                            "FROM test_run WHERE job_id = $1", jid))
    c.kill()
    return {"child_sigkill_to_running_again": summary(again)}


def cpu_bound(db: SyncDB, procs: Procs, settings: Settings, jobs: int = 40,
              work: int = 2_000_000) -> dict[str, Any]:
    """CPU-bound sync handlers (a fixed loop of `work` steps, ~0.25 s of one
    core), concurrency 2 per consumer: thread pool vs process pool, with 1 and
    with 2 consumer processes. Threads of one process share one GIL."""
    set_queue(db, "proc", lease_s=30)
    out: dict[str, Any] = {"jobs": jobs, "work_steps_per_job": work, "cores": os.cpu_count()}
    for consumers in (1, 2):
        for pool in ("thread", "process"):
            fleet = [procs.consumer("--queue", "proc", "--pool", pool, "--concurrency", "2")
                     for _ in range(consumers)]
            for c in fleet:
                c.worker_id()
            ids = publish(settings, "proc", [{"work": work} for _ in range(jobs)])
            wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                                      "status = 'completed'", ids) == jobs, 300, "drain")
            secs = db.val("SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
                          " FROM jobq.job WHERE id = ANY($1)", ids)
            out[f"{consumers}c_{pool}_jobs_per_s"] = round(jobs / secs, 2)
            for c in fleet:
                c.kill()
        out[f"{consumers}c_process_over_thread"] = round(
            out[f"{consumers}c_process_jobs_per_s"] / out[f"{consumers}c_thread_jobs_per_s"], 2)
    return out


def run(trials: int = 3, stops_n: int = 20, stop_parallel: int = 5) -> dict[str, Any]:
    """All detection figures in one scratch database (bench/run.py --detection)."""
    with world(("work", "proc"), "detect") as w:
        w.procs.reaper()
        result: dict[str, Any] = {"lease_s": 30.0, "vanished_grace_s": 2.0,
                                  "run_s_every_attempt": 5.0}
        for n in (1, 8, 32):
            result[f"sigkill_{n}_jobs"] = kills(w.db, w.procs, w.settings, n, trials)
        if stops_n:
            result.update(stops(w.db, w.procs, w.settings, stops_n, stop_parallel))
        result["poison_among_7_healthy"] = poison(w.db, w.procs, w.settings)
        result.update(child_deaths(w.db, w.procs, w.settings, 10))
        result["cpu_bound"] = cpu_bound(w.db, w.procs, w.settings)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=3, help="kills per N (N = 1, 8, 32)")
    p.add_argument("--stops", type=int, default=20)
    p.add_argument("--stop-parallel", type=int, default=5)
    a = p.parse_args()
    print(json.dumps(run(a.trials, a.stops, a.stop_parallel), indent=2, default=float))


if __name__ == "__main__":
    main()
