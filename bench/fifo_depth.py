"""What one job of a deep ``fifo`` key costs the database, by depth (issue
#51, #49's flat-work rule): one key holds ``--depth`` jobs, the first
``--history`` of them already completed (retention keeps finished rows a
day by default), the rest parked behind the head, as a busy key's are.
Then ``--jobs`` of them go the consumer's way: the head's id is claimed,
completed, and its end releases the next (``unpark_freed``), all through
the statement functions on one connection. Per job: the backend's CPU
(/proc) and the buffers touched (pg_stat_database of the run's own
database). Flat means the same figures at every depth.

    .venv/bin/python bench/fifo_depth.py [--depths 1000,20000] [--jobs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import scratch
from claim_cost import cpu_s
from policy_cost import _blocks

from jobq.db import SESSION_SETTINGS
from jobq.sql import Q


async def trial(url: str, depth: int, jobs: int) -> dict[str, Any]:
    conn = await asyncpg.connect(url, server_settings=SESSION_SETTINGS)
    await conn.execute("INSERT INTO jobq.queue (name, lease_s, key_policy) "
                       "VALUES ('deep', 30, 'fifo')")
    for start in range(0, 2 * depth, 1000):  # every job of one key, in publish order
        await conn.execute("SELECT count(*) FROM (SELECT jobq.enqueue('deep', '{}', "
                           "key => 'k', relay_grace_s => 60) FROM generate_series(1, $1)) s",
                           min(1000, 2 * depth - start))
    # the first half ended long ago (kept by retention); the rest wait, parked
    await conn.execute("UPDATE jobq.job SET status = 'completed', finished_at = now() "
                       "WHERE seq < (SELECT min(seq) + $1 FROM jobq.job)", depth)
    await conn.execute("UPDATE jobq.job SET relay_after = 'infinity', published_at = NULL "
                       "WHERE status = 'queued' AND seq > (SELECT min(seq) FROM jobq.job "
                       "WHERE status = 'queued')")
    await conn.execute("VACUUM ANALYZE jobq.job")
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    head = await conn.fetchval("SELECT id FROM jobq.job WHERE status = 'queued' "
                               "AND relay_after < 'infinity'")
    b0 = await _blocks(conn)
    c0, t0 = cpu_s(backend), time.perf_counter()
    done = 0
    for _ in range(jobs):
        token = uuid.uuid4()
        (row,) = await conn.fetch(Q["claim"], [head], "bench", ["deep"], [token])
        assert not row["handed"] and row["id"] == head, dict(row)
        await conn.fetch(Q["complete"], [head], [row["lock"]], [None])
        nxt = await conn.fetch(Q["unpark_freed"], head, row["lock"], None)
        done += 1
        head = nxt[0]["id"]
    c1, t1 = cpu_s(backend), time.perf_counter()
    b1 = await _blocks(conn)
    await conn.close()
    return {"depth": depth, "history": depth, "jobs": done,
            "cpu_us_per_job": round((c1 - c0) / done * 1e6, 1),
            "blocks_per_job": round((b1 - b0) / done, 1),
            "wall_us_per_job": round((t1 - t0) / done * 1e6, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="1000,20000")
    p.add_argument("--jobs", type=int, default=300)
    a = p.parse_args()
    for depth in (int(d) for d in a.depths.split(",")):
        with scratch(("deep",)) as (url, _amqp, _ns):
            print(json.dumps(asyncio.run(trial(url, depth, a.jobs))), flush=True)


if __name__ == "__main__":
    main()
