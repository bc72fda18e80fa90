"""Where publish -> handler start goes, and what each job costs each process,
at paced rates (issue #49's last target: p99 at 50 % of capacity).

    .venv/bin/python bench/latency_parts.py [--rates 100,600,1100] [--seconds 10]

jobq alone, as bench/latency.py runs it: 2 consumers (--concurrency 16), a
reaper, no-op handlers (bench/latency_app.py) that report their start with one
UDP datagram, and a producer process of 16 callers on a fixed beat. Each job
is split by four clocks of one machine: the payload's time.time() before the
call (t), the row's ``created_at`` (the producer's statement began), the
publish call's return in the producer (the commit and the broker's confirm
done), the row's ``started_at`` (the claim's transaction began) and the
handler's start:

- ``queue_to_insert``: t -> created_at, the wait in the producer's group commit
- ``insert_to_confirm``: created_at -> the call's return, the row's commit and
  the broker's confirm, in series
- ``confirm_to_claim``: the call's return -> started_at, the delivery (negative
  when it beat the confirm back to the producer)
- ``claim_to_start``: started_at -> the handler's start, the claim's statement,
  its commit, and the start of the run

p50 / p90 / p99 of each over every job of the window, and the CPU each
process used a job (utime + stime from /proc over the window: consumers,
reaper, RabbitMQ's beam.smp, every PostgreSQL process, and the producer's
whole life, its start-up included); and, over every task on the machine but
the producer, what the scheduler says a job cost: ms on a CPU, ms runnable
but waiting for one, timeslices (/proc/*/task/*/schedstat).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import pace
from benchenv import scratch, service_env
from idle_cost import Latencies, _cpu_of, _pct

from harness.helpers import Procs, SyncDB

PARTS = ("queue_to_insert", "insert_to_confirm", "confirm_to_claim", "claim_to_start", "total")


def produce(rate: float, secs: float, callers: int) -> None:
    """Publish "lat" jobs with their index; print {"sent", "returned": {i: time}}."""
    from jobq.client.producer import Client
    from jobq.newjob import NewJob
    from jobq.settings import Settings

    returned: dict[int, float] = {}
    count = 0

    async def one(client: Client) -> None:
        nonlocal count
        count += 1
        i = count
        await client.publish_many([NewJob("lat", {"t": time.time(), "i": i})])
        returned[i] = time.time()

    async def go() -> int:
        async with Client(Settings()) as client:
            return await pace.paced(rate, secs, callers, lambda _: one(client))

    sent = asyncio.run(go())
    print(json.dumps({"sent": sent, "returned": returned}), flush=True)


def _cpu(pids: list[int]) -> float:
    """Seconds of CPU (utime + stime) these processes used so far."""
    return sum(_cpu_of(p) for p in pids)


def sched() -> tuple[int, int, int]:
    """Every task alive now, summed from /proc/*/task/*/schedstat: ns on a
    CPU, ns runnable but waiting for one, timeslices. The wait is what a
    busy box costs a path that has to be scheduled at each hop."""
    run = wait = slices = 0
    for f in Path("/proc").glob("[0-9]*/task/*/schedstat"):
        try:
            a, b, c = f.read_text().split()
        except (OSError, ValueError):
            continue  # the task ended meanwhile
        run, wait, slices = run + int(a), wait + int(b), slices + int(c)
    return run, wait, slices


def sched_a_job(before: tuple[int, int, int], after: tuple[int, int, int],
                jobs: int) -> dict[str, float]:
    """Per job between two sched(): ms run, ms waiting for a CPU, timeslices
    (of the tasks alive at both: a process that exited in between is not in it)."""
    n = max(jobs, 1)
    return {"run_ms": round((after[0] - before[0]) / 1e6 / n, 3),
            "runq_wait_ms": round((after[1] - before[1]) / 1e6 / n, 3),
            "slices": round((after[2] - before[2]) / n, 1)}


def _pids(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _parts(rows: list[Any], returned: dict[int, float],
           started: dict[int, float]) -> dict[str, list[float]]:
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    for r in rows:
        i = r["i"]
        if i not in returned or i not in started or r["s"] is None:
            continue
        t = r["t"]
        for name, ms in zip(PARTS, (r["c"] - t, returned[i] - r["c"], r["s"] - returned[i],
                                    t + started[i] - r["s"], started[i])):
            parts[name].append(ms * 1000)
    return parts


def level(env: dict[str, str], lat: Latencies, db: SyncDB,
          rate: float, seconds: float, callers: int) -> dict[str, Any]:
    groups = {"consumers": _pids("jobq consume"), "reaper": _pids("jobq reap"),
              "broker": _pids("beam.smp"), "postgres": _pids("postgres")}
    before = {k: _cpu(v) for k, v in groups.items()}
    tasks = sched()
    with tempfile.TemporaryFile("w+") as said:  # not a pipe: its report outgrows one
        producer = subprocess.Popen([sys.executable, __file__, "produce", str(rate),
                                     str(seconds), str(callers)], env=env, stdout=said)
        own = 0.0
        while producer.poll() is None:
            own = _cpu([producer.pid]) or own  # its last reading before it exits
            time.sleep(0.1)
        tasks_after = sched()
        said.seek(0)
        got = json.loads(said.read().strip().splitlines()[-1])
    groups["postgres"] = sorted(set(groups["postgres"]) | set(_pids("postgres")))
    cpu = {k: _cpu(v) - before.get(k, 0.0) for k, v in groups.items()}
    cpu["producer"] = own
    sent = int(got["sent"])
    returned = {int(k): v for k, v in got["returned"].items()}
    deadline = time.monotonic() + 30
    while sum(1 for i in returned if i in lat.by_index) < len(returned) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = db.fetch("SELECT (payload->>'i')::int AS i, (payload->>'t')::float8 AS t, "
                    "extract(epoch FROM created_at)::float8 AS c, "
                    "extract(epoch FROM started_at)::float8 AS s "
                    "FROM jobq.job WHERE (payload->>'i')::int = ANY($1::int[])",
                    list(returned))
    parts = _parts(rows, returned, dict(lat.by_index))
    out: dict[str, Any] = {"offered_per_s": rate, "jobs": sent}
    for name, ms in parts.items():
        if ms:
            out[name] = [round(_pct(ms, q), 2) for q in (0.5, 0.9, 0.99)]
    ms_a_job = {k: round(v * 1000 / max(sent, 1), 3) for k, v in cpu.items()}
    out["cpu_ms_a_job"] = {**ms_a_job, "all": round(sum(ms_a_job.values()), 3)}
    out["sched_a_job"] = sched_a_job(tasks, tasks_after, sent)  # the producer not in it
    out["cores_busy"] = round(sum(cpu.values()) / seconds, 2)
    lat.by_index.clear()
    db.execute("DELETE FROM jobq.job")
    return out


@contextlib.contextmanager
def fleet(callers: int) -> Iterator[Callable[[float, float], dict[str, Any]]]:
    """jobq as latency.py runs it (2 consumers --concurrency 16, a reaper),
    warmed up; yields ``level(rate, seconds)`` against it."""
    with scratch(("lat",)) as (db_url, amqp_url, namespace):
        lat = Latencies()
        env = service_env(db_url, amqp_url, namespace, LAT_PORT=str(lat.port),
                          PYTHONPATH=str(HERE) + os.pathsep + str(HERE.parent))
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-latency-parts-")))
        db = SyncDB(db_url)
        try:
            for c in [procs.start("consume", "latency_app:app", "--concurrency", "16")
                      for _ in range(2)]:
                c.worker_id()
            procs.start("reap")
            level(env, lat, db, 200, 2, callers)  # warm up: connections, plans
            yield lambda rate, secs: level(env, lat, db, rate, secs, callers)
        finally:
            db.close()
            procs.close()


def main() -> None:
    if sys.argv[1:2] == ["produce"]:
        produce(float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100,600,1100", help="jobs a second, comma-separated")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--callers", type=int, default=16)
    a = ap.parse_args()
    with fleet(a.callers) as at:
        report = {"conditions": {"consumers": "2 x --concurrency 16", "reaper": 1,
                                 "callers": a.callers, "seconds": a.seconds,
                                 "parts": "p50, p90, p99 ms"},
                  "levels": [at(float(r), a.seconds) for r in a.rates.split(",")]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
