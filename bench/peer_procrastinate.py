"""procrastinate: python peer_procrastinate.py setup | fill N | worker"""
import asyncio
import os
import sys

import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=os.environ["PEER_DATABASE_URL"]))


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
                                       wait=False, install_signal_handlers=False)


if __name__ == "__main__":
    asyncio.run(main())
