"""What a single publish into an idle system cannot go under (issue #37):

    .venv/bin/python bench/publish_floor.py [--n 400]

One publish every 50 ms, nothing else running. jobq's publish call is two
durable writes one after the other (I1: the row commits before its id is on
the wire): the row's commit, then the broker's confirm of a persistent
message to a quorum queue. Timed apart, and beside the servers' own floors
for the same writes without jobq: a one-row INSERT's commit into a bare
table, and a raw confirmed persistent publish to a quorum queue (aio-pika).
p50 / p90 / p99 / max in ms over every publish.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import aio_pika
import asyncpg
from benchenv import scratch

from jobq.client.producer import Client
from jobq.client.store import Row
from jobq.newjob import NewJob
from jobq.settings import Settings

GAP_S = 0.05


def line(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    q = [xs[len(xs) // 2], xs[int(len(xs) * .9)], xs[int(len(xs) * .99)], xs[-1]]
    return f"{name:38s} " + " / ".join(f"{v:6.2f}" for v in q)


async def jobq_split(settings: Settings, n: int) -> tuple[list[float], list[float]]:
    commit, confirm = [], []
    async with Client(settings) as c:
        await c.publish("work", {})  # the session's plans, the queue declared
        assert c._rows is not None
        for _ in range(n):
            t0 = time.perf_counter()
            (job_id,) = await c._rows.insert([Row(NewJob("work", {}), "{}")])
            t1 = time.perf_counter()
            await c.broker.publish([(job_id, "work")])
            t2 = time.perf_counter()
            commit.append((t1 - t0) * 1e3)
            confirm.append((t2 - t1) * 1e3)
            await asyncio.sleep(GAP_S)
    return commit, confirm


async def raw(db_url: str, amqp_url: str, n: int) -> tuple[list[float], list[float]]:
    conn = await asyncpg.connect(db_url)
    await conn.execute("CREATE TABLE floor (id uuid PRIMARY KEY, body jsonb)")
    mq = await aio_pika.connect(amqp_url)
    ch = await mq.channel(publisher_confirms=True)
    name = f"floor-{uuid.uuid4().hex[:6]}"
    await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    ins, pub = [], []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            await conn.execute("INSERT INTO floor VALUES ($1, '{}')", uuid.uuid4())
            t1 = time.perf_counter()
            await ch.default_exchange.publish(
                aio_pika.Message(str(uuid.uuid4()).encode(),
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=name)
            t2 = time.perf_counter()
            ins.append((t1 - t0) * 1e3)
            pub.append((t2 - t1) * 1e3)
            await asyncio.sleep(GAP_S)
    finally:
        await ch.queue_delete(name)
        await mq.close()
        await conn.close()
    return ins, pub


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400)
    args = ap.parse_args()
    print(f"publish floor, {args.n} publishes {GAP_S * 1000:.0f} ms apart, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; p50 / p90 / p99 / max ms")
    with scratch(queues=("work",)) as (db_url, amqp_url, ns):
        settings = Settings(database_url=db_url, amqp_url=amqp_url, namespace=ns)
        commit, confirm = asyncio.run(jobq_split(settings, args.n))
        ins, pub = asyncio.run(raw(db_url, amqp_url, args.n))
    print(line("jobq: the row's commit", commit))
    print(line("jobq: the broker's confirm", confirm))
    print(line("jobq: the publish call (both)", [a + b for a, b in zip(commit, confirm)]))
    print(line("PostgreSQL alone: one-row INSERT commit", ins))
    print(line("RabbitMQ alone: confirmed publish", pub))
    print(line("the two alone, in sequence", [a + b for a, b in zip(ins, pub)]))


if __name__ == "__main__":
    main()
