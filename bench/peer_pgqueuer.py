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


async def enqueue(n: int, batch: int) -> None:
    """fill: a backlog in batches of 1000; produce: the steady-state producer,
    batches of 100 as fast as enqueue goes (jobq's steady figure uses
    publish_many batches of 100 the same way)."""
    conn = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    q = Queries(AsyncpgDriver(conn))
    for i in range(0, n, batch):
        k = min(batch, n - i)
        await q.enqueue(["noop"] * k, [None] * k, [0] * k)
    await conn.close()


async def worker() -> None:
    pgq = await create()
    await pgq.run(batch_size=10)


if __name__ == "__main__":
    if sys.argv[1] in ("fill", "produce"):
        asyncio.run(enqueue(int(sys.argv[2]), 1000 if sys.argv[1] == "fill" else 100))
    else:
        asyncio.run(worker())
