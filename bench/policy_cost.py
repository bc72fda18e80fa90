"""What each key policy costs the database (issue #51's bench row): per
policy, a queue of its own holds ``--keys`` keyed jobs (one per key, 100 k
by default) published through ``jobq.enqueue_many`` (a singleton's check
and a fifo's sequence are made at the insert), then ``--jobs`` of them are
claimed and completed in batches of 16, as a consumer does, through the
claim and complete functions on one connection. Per job: the backend's CPU
(/proc) and the buffers it touched (pg_stat_database of the run's own
database, nothing else connected), for the publish and for claim +
complete. ``none`` is the same jobs without keys; ``queue`` is keyed with
the default policy (no per-key limit): policy off. ``priority`` and
``aging`` (issue #51.6) are unkeyed with every other job at priority 9, so
each claim takes the full path with its swap; ``aging`` adds
``priority_aging_s = 1`` (the claim's second probe, the 64 longest due).

    .venv/bin/python bench/policy_cost.py [--keys 100000] [--jobs 4000] [--policies ...]
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

from jobq.db import SESSION_SETTINGS
from jobq.sql import Q

POLICIES = ("none", "queue", "fifo", "latest", "singleton", "priority", "aging")
UNKEYED = ("none", "priority", "aging")
BATCH = 16


async def _blocks(conn: asyncpg.Connection) -> int:
    await asyncio.sleep(1.2)  # an idle backend flushes its counters after ~1 s
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(await conn.fetchval("SELECT blks_hit + blks_read FROM pg_stat_database "
                                   "WHERE datname = current_database()"))


async def _publish(conn: asyncpg.Connection, queue: str, keys: int, keyed: bool,
                   mixed: bool) -> None:
    for start in range(0, keys, 1000):  # batches of 1,000, as a bulk publish would
        n = min(1000, keys - start)
        await conn.execute(
            "SELECT count(*) FROM jobq.enqueue_many(array_fill($1::text, ARRAY[$2::int]), "
            "array_fill('{}'::jsonb, ARRAY[$2::int]), keys => CASE WHEN $4 THEN "
            "ARRAY(SELECT 'k' || g FROM generate_series($3::int, $3 + $2 - 1) g) END, "
            "priorities => CASE WHEN $5 THEN ARRAY(SELECT (g % 2) * 9 FROM "
            "generate_series(1, $2) g) END, relay_grace_s => 60)", queue, n, start, keyed, mixed)


async def trial(url: str, policy: str, keys: int, jobs: int) -> dict[str, Any]:
    conn = await asyncpg.connect(url, server_settings=SESSION_SETTINGS)
    queue = f"p_{policy}"
    await conn.execute("INSERT INTO jobq.queue (name, lease_s, key_policy, priority_aging_s) "
                       "VALUES ($1, 30, $2, $3)", queue,
                       "queue" if policy in UNKEYED else policy,
                       1.0 if policy == "aging" else None)
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    b0 = await _blocks(conn)
    c0, t0 = cpu_s(backend), time.perf_counter()
    await _publish(conn, queue, keys, policy not in UNKEYED, policy in ("priority", "aging"))
    c1, t1 = cpu_s(backend), time.perf_counter()
    b1 = await _blocks(conn)
    await conn.execute("ANALYZE jobq.job")
    ids = [r[0] for r in await conn.fetch(
        "SELECT id FROM jobq.job WHERE queue = $1 ORDER BY created_at, id LIMIT $2", queue, jobs)]
    b2 = await _blocks(conn)
    c2, t2 = cpu_s(backend), time.perf_counter()
    claimed = 0
    for pos in range(0, len(ids), BATCH):
        batch = ids[pos:pos + BATCH]
        rows = await conn.fetch(Q["claim"], batch, "bench", [queue],
                                [uuid.uuid4() for _ in batch])
        mine = [r for r in rows if not r["handed"]]
        claimed += len(mine)
        await conn.fetch(Q["complete"], [r["id"] for r in mine], [r["lock"] for r in mine],
                         [None] * len(mine))
    c3, t3 = cpu_s(backend), time.perf_counter()
    b3 = await _blocks(conn)
    await conn.close()
    return {"policy": policy, "keys": keys if policy not in UNKEYED else 0, "claimed": claimed,
            "publish_cpu_us_per_job": round((c1 - c0) / keys * 1e6, 1),
            "publish_blocks_per_job": round((b1 - b0) / keys, 1),
            "publish_wall_us_per_job": round((t1 - t0) / keys * 1e6, 1),
            "run_cpu_us_per_job": round((c3 - c2) / max(claimed, 1) * 1e6, 1),
            "run_blocks_per_job": round((b3 - b2) / max(claimed, 1), 1),
            "run_wall_us_per_job": round((t3 - t2) / max(claimed, 1) * 1e6, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--policies", default=",".join(POLICIES), help="a comma list of "
                   f"{', '.join(POLICIES)}; the first is the base of the last column")
    a = p.parse_args()
    rows = []
    for policy in a.policies.split(","):  # each on a database of its own
        with scratch((f"p_{policy}",)) as (url, _amqp, _ns):
            rows.append(asyncio.run(trial(url, policy, a.keys, a.jobs)))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[1] if a.policies == ",".join(POLICIES) else rows[0]  # keyed, policy off
    print(f"\n{a.keys} keyed jobs per policy, {a.jobs} claimed and completed in batches of "
          f"{BATCH}; server CPU from /proc, buffers from pg_stat_database")
    print("| policy | publish µs/job | publish buffers/job | claim+complete µs/job | "
          "claim+complete buffers/job | vs queue (off) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['policy']} | {r['publish_cpu_us_per_job']} | {r['publish_blocks_per_job']} "
              f"| {r['run_cpu_us_per_job']} | {r['run_blocks_per_job']} | "
              f"{r['run_cpu_us_per_job'] / max(base['run_cpu_us_per_job'], 0.1):.2f}× |")


if __name__ == "__main__":
    main()
