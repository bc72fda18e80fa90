"""The floor under publish -> start at load (issue #49's last target): what
the contract's writes alone cost on this machine, beside jobq, same run.

    .venv/bin/python bench/latency_floor.py [--rates 25,100,260] [--seconds 10]

DESIGN.md fixes a start's path: the row commits before its id is on the
wire (I1); the id goes as a persistent message to a quorum queue with a
publisher confirm (the wire format), which a quorum queue delivers only once
its log has it; the claim commits before the ack and the start (I1). "floor"
is those writes and nothing else, written straight against asyncpg and
aio-pika: a producer process of --callers callers, each publish one INSERT
(autocommit) and one confirmed persistent publish; 2 consumer processes
(uvloop, as ``jobq consume``; prefetch 16) that on each delivery run one
UPDATE claiming the row (autocommit), ack, report the start with one UDP
datagram (as bench/latency_app.py), then one UPDATE completing it. No leases,
no renewals, no reaper, no batching, no history.

Both run at the same fixed rates (--callers callers on a fixed beat, as
bench/latency.py), jobq exactly as bench/latency_parts.py runs it (2
consumers --concurrency 16, a reaper); floor's capacity (a flood of 8 s)
too. For each: publish -> start over every job, and what each job cost the
machine by the scheduler's count (ms on a CPU, ms runnable but waiting for
one, timeslices; every task but the producer). Where floor's p99 is over
10 ms at a rate far below jobq's capacity, the contract's writes alone miss
the target on this machine, whatever jobq does above them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import latency
import latency_parts
import pace
from benchenv import scratch
from idle_cost import Latencies

TABLE = """CREATE TABLE floor_job (id uuid PRIMARY KEY, payload jsonb NOT NULL,
    status text NOT NULL DEFAULT 'queued', created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz, finished_at timestamptz)"""
QUEUE_ARGS: dict[str, Any] = {"x-queue-type": "quorum"}  # as jobq.amqp.broker declares a job queue


async def _channel(amqp_url: str, queue: str) -> tuple[Any, Any, Any]:
    import aio_pika
    conn = await aio_pika.connect(amqp_url)
    ch = await conn.channel(publisher_confirms=True)
    q = await ch.declare_queue(queue, durable=True, arguments=QUEUE_ARGS)
    return conn, ch, q


def produce(db_url: str, amqp_url: str, queue: str, rate: float, secs: float,
            callers: int) -> None:
    """Paced publishes: INSERT (autocommit), then a confirmed persistent message."""
    import aio_pika
    import asyncpg

    async def go() -> int:
        pool = await asyncpg.create_pool(db_url, min_size=callers, max_size=callers)
        conn, ch, _q = await _channel(amqp_url, queue)

        async def one(_caller: int) -> None:
            jid = uuid.uuid4()
            await pool.execute("INSERT INTO floor_job (id, payload) VALUES ($1, $2)",
                               jid, json.dumps({"t": time.time()}))
            await ch.default_exchange.publish(
                aio_pika.Message(str(jid).encode(), delivery_mode=2), routing_key=queue)

        try:
            return await pace.paced(rate, secs, callers, one)
        finally:
            await conn.close()
            await pool.close()

    print(json.dumps({"sent": asyncio.run(go())}), flush=True)


def work(db_url: str, amqp_url: str, queue: str, port: int) -> None:
    """Claim (commit), ack, report the start, complete: one job at a time per
    delivery, up to 16 at once."""
    import asyncpg
    import uvloop

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    async def go() -> None:
        pool = await asyncpg.create_pool(db_url, min_size=4, max_size=16)
        _conn, ch, q = await _channel(amqp_url, queue)
        await ch.set_qos(prefetch_count=16)

        async def on(message: Any) -> None:
            jid = uuid.UUID(message.body.decode())
            payload = await pool.fetchval(
                "UPDATE floor_job SET status = 'active', started_at = now() "
                "WHERE id = $1 AND status = 'queued' RETURNING payload", jid)
            await message.ack()
            if payload is not None:
                sock.sendto(str(time.time() - json.loads(payload)["t"]).encode(),
                            ("127.0.0.1", port))
                await pool.execute("UPDATE floor_job SET status = 'completed', "
                                   "finished_at = now() WHERE id = $1", jid)

        await q.consume(on)  # aiormq runs each delivery's callback as a task of its own
        await asyncio.Future()

    uvloop.run(go())


def floor(seconds: float, callers: int, rates: list[float]) -> dict[str, Any]:
    """floor's capacity (a flood of 8 s), then each rate: p50 / p99 / max,
    and the scheduler's figures a job (latency_parts.sched_a_job)."""
    with scratch(("floor",)) as (db_url, amqp_url, namespace):
        queue = f"{namespace}.floor"  # scratch() deletes it with the namespace's queues
        subprocess.run(["psql", "-q", db_url, "-c", TABLE], check=True)
        lat = Latencies()
        me = [sys.executable, __file__]
        logs = Path(tempfile.mkdtemp(prefix="jobq-latency-floor-"))
        workers = [subprocess.Popen([*me, "work", db_url, amqp_url, queue, str(lat.port)],
                                    stdout=(logs / f"work{k}.log").open("w"),
                                    stderr=subprocess.STDOUT) for k in range(2)]
        time.sleep(2)

        def offer(rate: float, secs: float) -> int:
            out = subprocess.run([*me, "produce", db_url, amqp_url, queue, str(rate),
                                  str(secs), str(callers)], check=True, capture_output=True,
                                 text=True)
            return int(json.loads(out.stdout.strip().splitlines()[-1])["sent"])

        def at(rate: float) -> dict[str, Any]:
            before: list[tuple[int, int, int]] = []
            sent: list[int] = []

            def go() -> int:
                before.append(latency_parts.sched())
                sent.append(offer(rate, seconds))
                before.append(latency_parts.sched())
                return sent[0]

            done, ms = latency._window(lat, go, seconds)
            return {"offered_per_s": rate, "done_per_s": round(done), **latency._summary(ms),
                    "sched_a_job": latency_parts.sched_a_job(before[0], before[1], sent[0])}

        try:
            offer(200, 2)  # warm up (connections, plans)
            capacity, _ = latency._window(lat, lambda: offer(latency.FLOOD, 8), 8)
            return {"capacity_per_s": round(capacity), "levels": [at(r) for r in rates]}
        finally:
            for w in workers:
                w.kill()
                w.wait()


def jobq(seconds: float, callers: int, rates: list[float]) -> dict[str, Any]:
    """jobq as bench/latency_parts.py runs it, at the same rates."""
    with latency_parts.fleet(callers) as at:
        levels = [at(r, seconds) for r in rates]
    return {"levels": [{k: lv[k] for k in ("offered_per_s", "jobs", "total", "cpu_ms_a_job",
                                           "sched_a_job", "cores_busy")} for lv in levels]}


def main() -> None:
    verbs = {"produce": lambda a: produce(a[0], a[1], a[2], float(a[3]), float(a[4]),
                                          int(a[5])),
             "work": lambda a: work(a[0], a[1], a[2], int(a[3]))}
    if sys.argv[1:2] and sys.argv[1] in verbs:
        verbs[sys.argv[1]](sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="25,100,260", help="jobs a second, comma-separated")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--callers", type=int, default=16)
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    report: dict[str, Any] = {
        "conditions": {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": a.seconds,
                       "callers": a.callers, "cpus": os.cpu_count(),
                       "total": "p50, p90, p99 ms (jobq); floor: p50, p99, max"},
        "jobq": jobq(a.seconds, a.callers, rates),
        "floor": floor(a.seconds, a.callers, rates)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
