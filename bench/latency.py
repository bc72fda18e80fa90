"""Publish -> handler start at load (issue #37): jobq, pgqueuer, procrastinate
and Celery, same machine, same sitting.

    .venv/bin/python bench/latency.py [--seconds 15] [--callers 16] [--peers ...]

Each system gets 2 worker processes (jobq: --concurrency 16, and a reaper;
pgqueuer: its defaults, batch 10; procrastinate: 16 concurrent jobs each, a
pool of 20; Celery: solo pool, acks_late, prefetch 4) and no-op handlers that report, with one
UDP datagram, how long after its publish (the payload's time.time()) they
started. First its capacity: --callers callers publishing single jobs as
fast as they can for 8 s (completions a second). Then at 20 %, 50 % and 80 %
of that capacity, an open-loop schedule (each caller publishes on a fixed
beat, so a slow publish does not lower the offered load) for --seconds:
p50, p99 and max over every job of the window; for jobq also the publish
call's own p50 and p99 (call_*: timed in the producer), and its two durable
writes apart (commit_*: the row's group commit; confirm_*: the broker's
confirm of the id), the part of the start no consumer can shorten.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import pace
from benchenv import scratch, service_env
from idle_cost import Latencies, _pct
from peers import PY, VENV, ensure_venv

from harness.helpers import Procs
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.settings import Settings

FRACTIONS = (0.2, 0.5, 0.8)
PEERS = ("pgqueuer", "procrastinate", "celery")
FLOOD = 1e6  # jobs/s offered when measuring capacity: as fast as callers go


def _summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50": round(statistics.median(ms), 2),
            "p99": round(_pct(ms, 0.99), 2), "max": round(max(ms), 2)}


def _window(lat: Latencies, offer: Any, seconds: float) -> tuple[float, list[float]]:
    """Run ``offer()`` (blocks ``seconds``), then wait for its jobs; returns
    (completions a second during the offer, latencies in ms)."""
    start = len(lat.values)
    t0 = time.monotonic()
    offered = offer()
    took = time.monotonic() - t0
    done_in_window = len(lat.values) - start
    deadline = time.monotonic() + 30
    while len(lat.values) - start < offered and time.monotonic() < deadline:
        time.sleep(0.05)
    return done_in_window / took, [v * 1000 for v in lat.values[start:]]


def jobq(seconds: float, callers: int) -> dict[str, Any]:
    with scratch(("lat",)) as (db_url, amqp_url, namespace):
        lat = Latencies()
        env = service_env(db_url, amqp_url, namespace, LAT_PORT=str(lat.port),
                          PYTHONPATH=str(HERE) + os.pathsep + str(HERE.parent))
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-latency-")))
        for c in [procs.start("consume", "latency_app:app", "--concurrency", "16")
                  for _ in range(2)]:
            c.worker_id()
        procs.start("reap")
        def offer(rate: float, secs: float) -> int:
            # In a process of its own, as pgqueuer's: the producer never
            # shares a GIL with this process's datagram receiver.
            out = subprocess.run([sys.executable, __file__, "produce", str(rate), str(secs),
                                  str(callers)], env=env, check=True, capture_output=True,
                                 text=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            calls.append({k: v for k, v in got.items() if k != "sent"})
            return int(got["sent"])

        calls: list[dict[str, float]] = []
        try:
            out = _levels(lat, offer, seconds)
        finally:
            procs.close()
        for f, split in zip(FRACTIONS, calls[2:]):  # after the warm-up and the flood
            out[f"at_{int(f * 100)}pct"].update(split)
        return out


def peer(name: str, seconds: float, callers: int) -> dict[str, Any]:
    """pgqueuer (its defaults, batch 10), procrastinate (``serve 16``: 16
    concurrent jobs per worker, as jobq's) or Celery (solo pool, acks_late,
    prefetch 4): 2 workers each, the producer in a process of its own."""
    with scratch(queues=()) as (db_url, amqp_url, _ns):
        lat = Latencies()
        env = {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url,
               "PEER_AMQP_URL": amqp_url, "PEER_POOL_MAX": "20",
               "PEER_QUEUE": f"celery-lat-{db_url.rsplit('/', 1)[1][-8:]}",
               "LAT_PORT": str(lat.port), "PYTHONPATH": str(HERE)}
        script = str(HERE / f"peer_{name}.py")
        if name == "pgqueuer":
            subprocess.run([str(VENV / "bin" / "pgq"), "install"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            argv = [str(PY), script, "worker"]
        elif name == "procrastinate":
            subprocess.run([str(PY), script, "setup"], env=env, check=True)
            argv = [str(PY), script, "serve", "16"]
        else:
            argv = [str(PY), script, "worker", "solo"]
        workers = [subprocess.Popen(argv, env=env, cwd=HERE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL) for _ in range(2)]
        time.sleep(3)

        def offer(rate: float, secs: float) -> int:
            out = subprocess.run([str(PY), script, "paced", str(rate), str(secs),
                                  str(callers)], env=env, cwd=HERE, check=True,
                                 capture_output=True, text=True)
            sent: int = json.loads(out.stdout.strip().splitlines()[-1])["sent"]
            return sent

        try:
            return _levels(lat, offer, seconds)
        finally:
            for w in workers:
                w.kill()
                w.wait()
            if name == "celery":  # its queue is not the namespace's: drop it here
                subprocess.run(["rabbitmqctl", "delete_queue", env["PEER_QUEUE"]],
                               capture_output=True, timeout=60)


def _levels(lat: Latencies, offer: Any, seconds: float) -> dict[str, Any]:
    offer(200, 2)  # warm up (connections, plans)
    capacity, _ = _window(lat, lambda: offer(FLOOD, 8), 8)
    out: dict[str, Any] = {"capacity_per_s": round(capacity)}
    for f in FRACTIONS:
        rate, ms = _window(lat, lambda f=f: offer(f * capacity, seconds), seconds)
        out[f"at_{int(f * 100)}pct"] = {"offered_per_s": round(f * capacity),
                                        "done_per_s": round(rate), **_summary(ms)}
        print(json.dumps(out), flush=True)
    return out


def produce(rate: float, secs: float, callers: int) -> None:
    """CALLERS tasks on one Client publishing single "lat" jobs, RATE a second
    in all, on a fixed beat; prints {"sent": n, "call_p50", "call_p99",
    "commit_p50", ..., "confirm_p99"}: the publish call's own time and its
    two writes', ms."""
    calls: list[float] = []
    commits: list[float] = []
    confirms: list[float] = []

    def timed(fn: Any, into: list[float]) -> Any:
        async def wrapper(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return await fn(*args)
            finally:
                into.append((time.perf_counter() - t) * 1000)
        return wrapper

    async def one(client: Client) -> None:
        t = time.perf_counter()
        await client.publish_many([NewJob("lat", {"t": time.time()})])
        calls.append((time.perf_counter() - t) * 1000)

    async def go() -> int:
        async with Client(Settings()) as client:
            # The call's two durable writes, timed apart: the (group) commit
            # of the row and the broker's confirm of the id.
            assert client._rows is not None
            client._rows.insert = timed(client._rows.insert, commits)  # type: ignore[method-assign]
            client.broker.publish = timed(client.broker.publish, confirms)  # type: ignore[method-assign]
            return await pace.paced(rate, secs, callers, lambda _: one(client))

    sent = asyncio.run(go())
    print(json.dumps({"sent": sent, **{f"{name}_{q}": round(
        statistics.median(xs) if q == "p50" else _pct(xs, 0.99), 2)
        for name, xs in (("call", calls), ("commit", commits), ("confirm", confirms))
        for q in ("p50", "p99")}}), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["produce"]:
        produce(float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--callers", type=int, default=16)
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    a = ap.parse_args()
    ensure_venv()
    report: dict[str, Any] = {"jobq": jobq(a.seconds, a.callers)}
    for name in a.peers:
        try:
            report[name] = peer(name, a.seconds, a.callers)
        except Exception as exc:  # a peer failing must not hide the others
            report[name] = {"error": repr(exc)}
    for f in FRACTIONS:
        key = f"at_{int(f * 100)}pct"
        for name in a.peers:
            if key in report[name]:
                report[f"p99_jobq_over_{name}_{key}"] = round(
                    report["jobq"][key]["p99"] / report[name][key]["p99"], 3)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
