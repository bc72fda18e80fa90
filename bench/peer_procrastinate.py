"""procrastinate: python peer_procrastinate.py setup | fill N | worker C (exits once the
queue is empty: a drain) | serve C (waits for jobs, as a deployed worker does)"""
import asyncio
import os
import sys

import procrastinate

# PEER_POOL_MAX: the connection pool's size (its default, 10, times 20 idle
# workers is over PostgreSQL's max_connections of 100 here)
_pool = {"min_size": 1, "max_size": int(os.environ["PEER_POOL_MAX"])} \
    if os.environ.get("PEER_POOL_MAX") else {}
app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=os.environ["PEER_DATABASE_URL"], **_pool))


@app.task(name="noop", queue="noop")
async def noop() -> None:
    return None


async def main() -> None:
    async with app.open_async():
        if sys.argv[1] == "setup":
            await app.schema_manager.apply_schema_async()
        elif sys.argv[1] == "fill":
            n = int(sys.argv[2])
            for i in range(0, n, 1000):
                await noop.batch_defer_async(*[{} for _ in range(min(1000, n - i))])
        else:
            await app.run_worker_async(queues=["noop"], concurrency=int(sys.argv[2]),
                                       wait=sys.argv[1] == "serve",
                                       install_signal_handlers=False)


if __name__ == "__main__":
    asyncio.run(main())
