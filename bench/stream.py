"""Emit -> receive, over every chunk (issue #52, item 5): how long after a
handler called ``job.emit`` a reader following ``client.stream`` has the
chunk, p50/p99/max.

    .venv/bin/python bench/stream.py [--jobs 20] [--chunks 50] [--every 0.02] [--consumers 2]

A fresh database and vhost (benchenv.scratch), one reaper, ``--consumers``
``jobq consume harness.apps:app --queue emits``. ``--jobs`` jobs each emit
``--chunks`` chunks ``--every`` seconds apart (harness/emits.py stamps each
with time.time() just before its emit); one reader per job, all in this
process, started before the jobs are published, takes the time each chunk
arrives. Same machine, same clock. Also printed: every chunk received once,
in order.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import scratch
from detection import pct

from harness.helpers import Procs, SyncDB, set_queue
from jobq import Chunk, Client, NewJob, Settings


async def _follow(client: Client, jid: Any, lat: list[float], seen: list[int]) -> None:
    async for item in client.stream(jid):
        if isinstance(item, Chunk):
            lat.append((time.time() - item.data["at"]) * 1000)
            seen.append(item.offset)


async def _measure(settings: Settings, jobs: int, chunks: int,
                   every: float) -> tuple[list[float], bool]:
    async with Client(settings) as client:
        ids = await client.publish_many(
            [NewJob("emits", {"chunks": chunks, "every": every})
             for _ in range(jobs)])
        lat: list[float] = []
        seen: list[list[int]] = [[] for _ in ids]
        await asyncio.wait_for(asyncio.gather(*(_follow(client, j, lat, s)
                                                for j, s in zip(ids, seen))), 300)
        in_order = all(s == list(range(1, chunks + 1)) for s in seen)
        return lat, in_order


def run(jobs: int, chunks: int, every: float, consumers: int) -> dict[str, Any]:
    with scratch(("emits",)) as (db_url, amqp_url, namespace):
        db = SyncDB(db_url)
        set_queue(db, "emits", lease_s=10)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
        env.update({"JOBQ_DATABASE_URL": db_url, "JOBQ_AMQP_URL": amqp_url,
                    "JOBQ_NAMESPACE": namespace, "HARNESS_DATABASE_URL": db_url,
                    "PYTHONPATH": str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")})
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-stream-")))
        try:
            procs.reaper()
            for _ in range(consumers):
                procs.consumer("--queue", "emits", "--concurrency", "16").worker_id()
            settings = Settings(database_url=db_url, amqp_url=amqp_url, namespace=namespace)
            lat, in_order = asyncio.run(_measure(settings, jobs, chunks, every))
            lat.sort()
            return {"jobs": jobs, "chunks_per_job": chunks, "every_s": every,
                    "consumers": consumers, "received": len(lat),
                    "all_in_order_once": in_order and len(lat) == jobs * chunks,
                    "emit_to_receive_ms_p50": round(statistics.median(lat), 1),
                    "emit_to_receive_ms_p99": round(pct(lat, 0.99), 1),
                    "emit_to_receive_ms_max": round(lat[-1], 1)}
        finally:
            procs.close()
            db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--chunks", type=int, default=50)
    ap.add_argument("--every", type=float, default=0.02)
    ap.add_argument("--consumers", type=int, default=2)
    args = ap.parse_args()
    print(run(args.jobs, args.chunks, args.every, args.consumers), flush=True)


if __name__ == "__main__":
    main()
