"""What dependencies cost (issue #31), on one connection, server CPU from
/proc: claiming and completing --jobs plain jobs, against the same number of
parents of fan-in callbacks, 1,000 each (each completion counts its callback
down in its own transaction: the trigger's one-row update), and the same again with
each job waiting for one parent that already completed. Every callback must
be released, by the last of its parents' completions.

    .venv/bin/python bench/workflows.py [--jobs 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import scratch

from jobq.db import SESSION_SETTINGS
from jobq.sql import Q

TICK = os.sysconf("SC_CLK_TCK")
BATCH = 8


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def _run(url: str, n: int, shape: str) -> dict[str, Any]:
    conn = await asyncpg.connect(url, server_settings=SESSION_SETTINGS)
    try:
        await conn.execute("TRUNCATE jobq.job CASCADE")
        await conn.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('b', 30) "
                           "ON CONFLICT DO NOTHING")
        ids = [r["id"] for r in await conn.fetch(
            "SELECT id FROM jobq.enqueue_many(array_fill('b'::text, ARRAY[$1::int]), "
            "array_fill('{}'::jsonb, ARRAY[$1::int]), array_fill(0::float8, ARRAY[$1::int]), "
            "array_fill(NULL::text, ARRAY[$1::int]), 60)", n)]
        callbacks: list[Any] = []
        if shape == "fan-in parents":  # 1,000 at most per job: one callback per 1,000
            for i in range(0, n, 1000):
                callbacks.append(await conn.fetchval(
                    "SELECT jobq.enqueue('cb', after => $1::uuid[])", ids[i:i + 1000]))
        elif shape == "each waits for a done job":
            done = await conn.fetchval("SELECT jobq.enqueue('b')")
            await conn.execute("UPDATE jobq.job SET status = 'completed' WHERE id = $1", done)
            ids = [await conn.fetchval("SELECT jobq.enqueue('b', after => ARRAY[$1]::uuid[])",
                                       done) for _ in range(n)]
        await conn.execute("VACUUM ANALYZE jobq.job")
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        t0 = _cpu(pid)
        for i in range(0, n, BATCH):
            batch = ids[i:i + BATCH]
            rows = await conn.fetch(Q["claim"], batch, "w", ["b"], [uuid.uuid4() for _ in batch])
            await conn.fetch(Q["complete"], [r["id"] for r in rows], [r["lock"] for r in rows],
                             [None] * len(rows))
        cpu = _cpu(pid) - t0
        out: dict[str, Any] = {"server_cpu_us_per_job": round(cpu / n * 1e6, 1)}
        if callbacks:
            out["callbacks_released"] = await conn.fetchval(
                "SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status = 'queued' "
                "AND waiting_on = 0 AND relay_after <= now()", callbacks)
            out["callbacks"] = len(callbacks)
        return out
    finally:
        await conn.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    shapes = ("plain", "fan-in parents", "each waits for a done job")
    res: dict[str, list[Any]] = {s: [] for s in shapes}
    with scratch(("b",)) as (url, _, _):
        for _ in range(a.rounds):
            for s in shapes:
                res[s].append(asyncio.run(_run(url, a.jobs, s)))
    cpu = {s: statistics.median(r["server_cpu_us_per_job"] for r in v) for s, v in res.items()}
    print(json.dumps({"jobs": a.jobs, "batch": BATCH, "rounds": res,
                      "median_cpu_us_per_job": cpu,
                      "ratio_to_plain": {s: round(c / cpu["plain"], 3) for s, c in cpu.items()}},
                     indent=2, default=str))


if __name__ == "__main__":
    main()
