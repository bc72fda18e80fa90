"""Where the CPU of jobq's steady end to end goes, every process (issue #37).

    .venv/bin/python bench/profile_steady.py [--jobs 30000] [--py-spy PATH] [--seconds 6]

The steady run of bench/publish_path.py (a producer process of 16 concurrent
single-job publishes, 2 consumers of concurrency 16, no-op handlers that
send one UDP datagram) plus a reaper. Over the whole run: CPU per job of
each process from /proc (producer, each consumer, the reaper, PostgreSQL's
backends, RabbitMQ). In the middle of it, for --seconds: py-spy (``pip
install py-spy``; --py-spy names its binary) samples every Python process at
200 Hz, and each one's samples are summed by what their innermost frame
belongs to (the event loop, asyncpg, the AMQP stack, jobq, the benchmark's
own handler, ...), so the table says which code a cut would have to come
from. PostgreSQL and RabbitMQ are measured, not profiled (their CPU per job).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world
from publish_path import cpu_of, pings

from jobq.client.producer import Client

# Innermost frame's file -> what it belongs to (first match wins).
KINDS = (("asyncpg", "asyncpg"), ("aio_pika", "AMQP (aio-pika, aiormq, pamqp)"),
         ("aiormq", "AMQP (aio-pika, aiormq, pamqp)"), ("pamqp", "AMQP (aio-pika, aiormq, pamqp)"),
         ("uvloop", "event loop"), ("asyncio", "event loop"), ("jobq/", "jobq"),
         ("ping_app", "benchmark handler"), ("producer_jobq", "benchmark producer"),
         ("pydantic", "pydantic"), ("json", "json"), ("uuid", "uuid"),
         ("prometheus", "metrics (prometheus_client)"), ("logging", "logging"))


def kind_of(frame: str) -> str:
    for needle, kind in KINDS:
        if needle in frame:
            return kind
    return "other"


def summarise(raw: Path) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """(samples, by kind of the innermost frame, by innermost jobq frame)."""
    kinds: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        total += int(n)
        kinds[kind_of(frames[-1])] += int(n)
        mine = [f for f in frames if "jobq/" in f and "jobq/__main__" not in f
                and "jobq/cli.py" not in f]
        if mine:  # the jobq frame this sample ran under, however deep
            ours[mine[-1].split(" (")[0] + " (" + mine[-1].rsplit("/", 1)[-1]] += int(n)
    return total, kinds, ours


def cpu_pid(pid: int) -> float:
    return cpu_of(lambda _c, p: p == pid)


def servers() -> tuple[float, float]:
    """CPU seconds so far of PostgreSQL's processes and of RabbitMQ's."""
    return cpu_of(lambda c, _: c == "postgres"), cpu_of(lambda c, _: c.startswith("beam"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=30000)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--py-spy", default="py-spy")
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="jobq-profile-"))
    env_path = f"{HERE}{os.pathsep}{HERE.parent}"
    with world(("noop",), "profile", JOBQ_LOG_LEVEL="WARNING", PYTHONPATH=env_path) as w:
        w.db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('noop', 30)")
        with pings(a.jobs + 1) as (port, first, done):
            procs = {f"consumer {i + 1}": w.procs.start(
                "consume", "ping_app:app", "--concurrency", "16", PING_PORT=str(port)).popen.pid
                for i in range(2)}
            procs["reaper"] = w.procs.start("reap").popen.pid

            async def probe() -> None:
                async with Client(w.settings) as c:
                    await c.publish("noop", {})

            asyncio.run(probe())
            first()
            env = {**w.procs.env, "PYTHONPATH": env_path}
            before = {k: cpu_pid(p) for k, p in procs.items()}
            pg0, mq0 = servers()
            t0 = time.time()
            producer = subprocess.Popen([sys.executable, str(HERE / "producer_jobq.py"),
                                         str(a.jobs), "16"], env=env, cwd=HERE,
                                        stdout=subprocess.PIPE, text=True)
            procs["producer"] = producer.pid
            before["producer"] = 0.0
            time.sleep(3)  # into the steady state
            spies = [subprocess.Popen([a.py_spy, "record", "--pid", str(pid), "--rate", "200",
                                       "--duration", str(a.seconds), "--nonblocking",
                                       "--format", "raw", "--output", str(out / f"{pid}.txt")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
                     for pid in procs.values()]
            for spy in spies:
                _, err = spy.communicate()
                if spy.returncode:
                    print(f"py-spy: {err.strip().splitlines()[0] if err.strip() else '?'}")
            printed, _ = producer.communicate()
            last = done()["last"]
            after = {k: cpu_pid(p) for k, p in procs.items() if k != "producer"}
            after["producer"] = json.loads(printed.strip().splitlines()[-1])["cpu_s"]
            pg1, mq1 = servers()
    n = a.jobs
    print(f"steady end to end: {n} jobs, 16 callers, 2 consumers of 16, a reaper: "
          f"{n / (last - t0):,.0f} jobs/s")
    print("CPU per job (ms), whole run:")
    rows = {k: (after[k] - before[k]) / n * 1000 for k in procs}
    rows["PostgreSQL (all backends)"] = (pg1 - pg0) / n * 1000
    rows["RabbitMQ"] = (mq1 - mq0) / n * 1000
    total = sum(rows.values())
    for k, v in rows.items():
        print(f"  {k:28} {v:6.3f}  {v / total:5.1%}")
    print(f"  {'all':28} {total:6.3f}")
    for name, pid in procs.items():
        raw = out / f"{pid}.txt"
        if not raw.exists():
            print(f"{name}: no py-spy samples (is py-spy installed? --py-spy)")
            continue
        total_s, kinds, ours = summarise(raw)
        busy = total_s / (200 * a.seconds)
        print(f"{name}: {total_s} samples over {a.seconds:g} s (on CPU {busy:.0%} of it)")
        for k, v in kinds.most_common():
            print(f"    {k:34} {v / total_s:5.1%}")
        print("    under jobq frames (innermost jobq function):")
        for k, v in ours.most_common(6):
            print(f"      {v / total_s:5.1%}  {k}")


if __name__ == "__main__":
    main()
