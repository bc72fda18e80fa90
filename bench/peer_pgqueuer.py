"""pgqueuer: python peer_pgqueuer.py fill N   |   pgq run peer_pgqueuer:create"""
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


if __name__ == "__main__":
    asyncio.run(fill(int(sys.argv[2])))
