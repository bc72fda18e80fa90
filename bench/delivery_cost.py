"""CPU per delivered message in the consumer's process (issue #37): aio-pika's
``queue.consume`` (an ``IncomingMessage`` and a second task per delivery, the
consumer's path before deliveries.py), jobq's ``deliveries.consume`` (a
``Delivery`` in aiormq's task), and raw aiormq as the floor, interleaved.

    .venv/bin/python bench/delivery_cost.py [--messages 40000] [--rounds 3]

Each round fills a quorum queue with N 36-byte bodies, then consumes them
with prefetch 64, a plain-function callback (the intake's shape) and one
``basic.ack multiple=True`` per 4 deliveries; the figure is this process's
CPU (user + system) per message while draining, RabbitMQ on the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import aiormq
import uvloop

from jobq.amqp.deliveries import consume

URL = "amqp://guest:guest@127.0.0.1/"
QUEUE = "jobq_bench_delivery_cost"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def fill(n: int) -> None:
    conn = await aiormq.connect(URL)
    ch = await conn.channel()
    await ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    await ch.queue_purge(QUEUE)
    for _ in range(0, n, 500):
        await asyncio.gather(*(ch.basic_publish(b"0" * 36, routing_key=QUEUE)
                               for _ in range(500)))
    await conn.close()


def acker(n: int, done: asyncio.Event, ack: Callable[[Any], Any]) -> Callable[[Any], None]:
    seen, batch = [0], [0]
    acking: set[asyncio.Future[Any]] = set()

    def on(msg: Any) -> None:
        seen[0] += 1
        batch[0] += 1
        if batch[0] == 4 or seen[0] == n:
            batch[0] = 0
            fut = asyncio.ensure_future(ack(msg))
            acking.add(fut)
            fut.add_done_callback(acking.discard)
        if seen[0] == n:
            done.set()
    return on


async def drain(kind: str, n: int) -> float:
    await fill(n)
    done = asyncio.Event()
    conn = await aio_pika.connect_robust(URL)
    c0 = cpu()
    if kind == "aio-pika IncomingMessage":
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=64)
        q = await ch.get_queue(QUEUE)
        await q.consume(acker(n, done, lambda m: m.ack(multiple=True)))  # type: ignore[arg-type]
    elif kind == "jobq Delivery":
        await consume(conn, [(QUEUE, None)], acker(n, done, lambda m: m.ack(multiple=True)), 64)
    else:
        raw = await aiormq.connect(URL)
        rch = await raw.channel()
        await rch.basic_qos(prefetch_count=64)
        on = acker(n, done, lambda m: rch.basic_ack(m.delivery_tag, multiple=True))

        async def deliver(m: Any) -> None:
            on(m)
        await rch.basic_consume(QUEUE, deliver)
    await done.wait()
    used = cpu() - c0
    if kind == "raw aiormq":
        await raw.close()
    await conn.close()
    return used / n * 1e6


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=40000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    kinds = ("aio-pika IncomingMessage", "jobq Delivery", "raw aiormq")
    got: dict[str, list[float]] = {k: [] for k in kinds}
    t0 = time.strftime("%H:%M")
    for _ in range(a.rounds):
        for k in kinds:
            got[k].append(await drain(k, a.messages))
    print(f"{t0}, {a.messages} messages a round, {a.rounds} rounds interleaved; "
          "consumer CPU per message (µs): median (rounds)")
    base = statistics.median(got[kinds[0]])
    for k in kinds:
        med = statistics.median(got[k])
        print(f"  {k:26} {med:6.1f}  ({', '.join(f'{v:.1f}' for v in got[k])})  "
              f"{med / base:.2f}x")
    conn = await aiormq.connect(URL)
    await (await conn.channel()).queue_delete(QUEUE)
    await conn.close()


if __name__ == "__main__":
    uvloop.run(main())
