"""jobq's producer for bench/publish_path.py, in its own process:
    python producer_jobq.py N CONCURRENCY [BATCH [relay]]
CONCURRENCY tasks publish one job per call (BATCH 1, the shape of a web app
enqueueing one job per request) or BATCH jobs per publish_many call (with
"relay": publish_many(relay=True), bench/bulk_enqueue.py); prints
{"t0", "t1", "cpu_s", "lat_p50_ms", "lat_p99_ms"} as JSON."""
import asyncio
import json
import os
import sys
import time

import uvloop

from jobq.client.producer import Client
from jobq.newjob import NewJob


async def main(n: int, concurrency: int, batch: int, relay: bool = False) -> dict[str, float]:
    async with Client() as client:
        left = [n]
        lat: list[float] = []

        async def one() -> None:
            while left[0] > 0:
                k = min(batch, left[0])
                left[0] -= k
                t = time.perf_counter()
                if batch == 1:
                    await client.publish("noop", {})
                else:
                    await client.publish_many([NewJob("noop", {}) for _ in range(k)], relay=relay)
                lat.append(time.perf_counter() - t)

        c0, t0 = os.times(), time.time()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        t1, c1 = time.time(), os.times()
    lat.sort()
    return {"t0": t0, "t1": t1, "cpu_s": c1.user + c1.system - c0.user - c0.system,
            "lat_p50_ms": lat[len(lat) // 2] * 1000, "lat_p99_ms": lat[int(len(lat) * .99)] * 1000}


if __name__ == "__main__":
    relay = sys.argv[-1] == "relay"
    args = [int(a) for a in sys.argv[1:] if a != "relay"] + [1]
    print(json.dumps(uvloop.run(main(args[0], args[1], args[2], relay))))
