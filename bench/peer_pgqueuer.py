"""pgqueuer: python peer_pgqueuer.py fill N | produce N | worker   (the worker runs PgQueuer.run
directly: pgqueuer 1.6.0's `pgq run --log-level` fails on its own log setup)"""
import asyncio
import os
import sys

import asyncpg
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver


async def create() -> PgQueuer:
    conn = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job) -> None:  # type: ignore[no-untyped-def]
        return None

    return pgq


async def fill(n: int) -> None:
    conn = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    q = Queries(AsyncpgDriver(conn))
    for i in range(0, n, 1000):
        k = min(1000, n - i)
        await q.enqueue(["noop"] * k, [None] * k, [0] * k)
    await conn.close()


async def produce(n: int) -> None:
    """The steady-state producer: batches of 100, as fast as enqueue goes
    (jobq's steady figure uses publish_many batches of 100 the same way)."""
    conn = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    q = Queries(AsyncpgDriver(conn))
    for i in range(0, n, 100):
        k = min(100, n - i)
        await q.enqueue(["noop"] * k, [None] * k, [0] * k)
    await conn.close()


async def worker() -> None:
    pgq = await create()
    await pgq.run(batch_size=10)


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        asyncio.run(fill(int(sys.argv[2])))
    elif sys.argv[1] == "produce":
        asyncio.run(produce(int(sys.argv[2])))
    else:
        asyncio.run(worker())
