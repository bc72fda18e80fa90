"""pgqueuer: python peer_pgqueuer.py fill N | produce N | single N CONCURRENCY | worker
| paced RATE SECONDS CONCURRENCY (jobs of entrypoint "lat", payload {"t": publish time})
(the worker runs PgQueuer.run directly: pgqueuer 1.6.0's `pgq run --log-level` fails on
its own log setup)"""
import asyncio
import json
import os
import socket
import sys
import time

import asyncpg
import pace
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver


async def create() -> PgQueuer:
    conn = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    pgq = PgQueuer(AsyncpgDriver(conn))

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    port = int(os.environ.get("PING_PORT", "0"))

    @pgq.entrypoint("noop")
    async def noop(job) -> None:  # type: ignore[no-untyped-def]
        if port:  # completion reported by UDP (bench/pingcount.py)
            sock.sendto(b"1", ("127.0.0.1", port))

    @pgq.entrypoint("lat")
    async def lat(job) -> None:  # type: ignore[no-untyped-def]
        # publish -> handler start, reported to bench/latency.py (LAT_PORT)
        t = json.loads(job.payload)["t"]
        sock.sendto(str(time.time() - t).encode(),
                    ("127.0.0.1", int(os.environ.get("LAT_PORT", "9"))))

    return pgq


async def paced(rate: float, seconds: float, concurrency: int) -> None:
    """CONCURRENCY connections publishing single "lat" jobs, RATE a second in
    all, on a fixed schedule (open loop: a slow enqueue does not slow the
    offered load)."""
    conns = [await asyncpg.connect(os.environ["PEER_DATABASE_URL"]) for _ in range(concurrency)]
    qs = [Queries(AsyncpgDriver(c)) for c in conns]
    sent = await pace.paced(rate, seconds, concurrency, lambda i: qs[i].enqueue(
        "lat", json.dumps({"t": time.time()}).encode(), 0))
    for c in conns:
        await c.close()
    print(json.dumps({"sent": sent}), flush=True)


async def enqueue(n: int, batch: int, timed: bool) -> None:
    """fill: a backlog in batches of 1000; produce: the steady-state producer,
    batches of 100 as fast as enqueue goes (jobq's steady figure uses
    publish_many batches of 100 the same way)."""
    conn = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    q = Queries(AsyncpgDriver(conn))
    c0, t0 = os.times(), time.time()
    for i in range(0, n, batch):
        k = min(batch, n - i)
        await q.enqueue(["noop"] * k, [None] * k, [0] * k)
    t1, c1 = time.time(), os.times()
    await conn.close()
    if timed:  # produce: for bench/bulk_enqueue.py
        print(json.dumps({"t0": t0, "t1": t1, "cpu_s": c1.user + c1.system - c0.user - c0.system}))


async def single(n: int, concurrency: int) -> None:
    """CONCURRENCY connections, each enqueuing one job per call (the shape of
    jobq's single publishes); prints {"t0", "t1", "cpu_s"}."""
    conns = [await asyncpg.connect(os.environ["PEER_DATABASE_URL"]) for _ in range(concurrency)]
    qs = [Queries(AsyncpgDriver(c)) for c in conns]
    left = [n]

    async def one(q: Queries) -> None:
        while left[0] > 0:
            left[0] -= 1
            await q.enqueue("noop", None, 0)

    c0, t0 = os.times(), time.time()
    await asyncio.gather(*(one(q) for q in qs))
    t1, c1 = time.time(), os.times()
    print(json.dumps({"t0": t0, "t1": t1, "cpu_s": c1.user + c1.system - c0.user - c0.system}))
    for c in conns:
        await c.close()


async def worker() -> None:
    """PGQ_MAX_TASKS caps the jobs one worker has picked at once (pgqueuer's
    max_concurrent_tasks, at least twice the batch); unset: no cap, its default."""
    pgq = await create()
    cap = int(os.environ.get("PGQ_MAX_TASKS", "0")) or None
    await pgq.run(batch_size=10, max_concurrent_tasks=cap)


if __name__ == "__main__":
    if sys.argv[1] == "paced":
        asyncio.run(paced(float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])))
    elif sys.argv[1] == "single":
        asyncio.run(single(int(sys.argv[2]), int(sys.argv[3])))
    elif sys.argv[1] in ("fill", "produce"):
        produce = sys.argv[1] == "produce"
        asyncio.run(enqueue(int(sys.argv[2]), 100 if produce else 1000, timed=produce))
    else:
        asyncio.run(worker())
