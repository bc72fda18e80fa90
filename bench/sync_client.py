"""The sync client against the async one (issue #32): single-job publishes
from 16 threads sharing one jobq.SyncClient (a Flask/gunicorn-threads view
pool) against 16 concurrent tasks on one jobq.Client, in the same sitting,
rounds interleaved, each round on an emptied job table. Prints publishes/s
per round, the medians and their ratio (target: sync >= 0.7 x async), and
the connections each held.

    .venv/bin/python bench/sync_client.py [--per-caller 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import scratch

from jobq import Client, SyncClient
from jobq.settings import Settings

CALLERS = 16


def _sync_round(settings: Settings, per: int) -> float:
    client = SyncClient(settings)
    client.publish("work", {"warm": True})  # connect outside the timing
    try:
        def caller(_: int) -> None:
            for i in range(per):
                client.publish("work", {"i": i})

        with ThreadPoolExecutor(CALLERS) as pool:
            start = time.perf_counter()
            list(pool.map(caller, range(CALLERS)))
            return CALLERS * per / (time.perf_counter() - start)
    finally:
        client.close()


async def _async_round(settings: Settings, per: int) -> float:
    async with Client(settings) as client:
        await client.publish("work", {"warm": True})

        async def caller() -> None:
            for i in range(per):
                await client.publish("work", {"i": i})

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(CALLERS)))
        return CALLERS * per / (time.perf_counter() - start)


async def _empty(url: str) -> None:
    conn = await asyncpg.connect(url)
    await conn.execute("TRUNCATE jobq.job CASCADE")
    await conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-caller", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with scratch(("work",)) as (db_url, amqp_url, namespace):
        settings = Settings(database_url=db_url, amqp_url=amqp_url, namespace=namespace)
        rates: dict[str, list[float]] = {"sync": [], "async": []}
        for r in range(args.rounds):
            for kind in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
                asyncio.run(_empty(db_url))
                rate = (_sync_round(settings, args.per_caller) if kind == "sync"
                        else asyncio.run(_async_round(settings, args.per_caller)))
                rates[kind].append(rate)
                print(f"round {r + 1} {kind:5}: {rate:8.0f} publishes/s", flush=True)
        s, a = statistics.median(rates["sync"]), statistics.median(rates["async"])
        print(f"\n{CALLERS} callers x {args.per_caller} single-job publishes, "
              f"{args.rounds} rounds interleaved")
        print(f"SyncClient (threads) median {s:.0f}/s, Client (tasks) median {a:.0f}/s: "
              f"ratio {s / a:.2f} (target >= 0.70)")


if __name__ == "__main__":
    main()
