"""Server CPU of the consumer's per-job statements, per call and per job,
by batch size (issue #16): the claim and the completion, called through
their functions on one connection, with the backend's CPU read from /proc.

    .venv/bin/python bench/claim_cost.py [--plan as-installed|custom|generic]

--plan overrides the functions' own plan setting (ALTER FUNCTION ... SET
plan_cache_mode) to compare: "custom" plans every call for its arguments,
"generic" keeps one plan per session (what queries.sql's ``-- plan:
generic`` installs, with sequential scans priced out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import scratch

from jobq.db import SESSION_SETTINGS
from jobq.ops.routines import GENERIC_SETTING, PINNED_PATH, PLAN_SETTING
from jobq.sql import Q, function_name

TICK = os.sysconf("SC_CLK_TCK")
PLANS = {"custom": PLAN_SETTING, "generic": GENERIC_SETTING}  # as routines.py installs them


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def measure(url: str, plan: str) -> list[dict[str, float]]:
    conn = await asyncpg.connect(url, server_settings=SESSION_SETTINGS)
    await conn.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('noop', 30)")
    if plan in PLANS:
        for fn in (function_name("claim"), function_name("complete")):
            args = await conn.fetchval(
                "SELECT pg_get_function_identity_arguments($1::regproc)", fn)
            await conn.execute(f"ALTER FUNCTION {fn}({args}) RESET ALL")
            await conn.execute(f"ALTER FUNCTION {fn}({args}) SET search_path = {PINNED_PATH} "
                               f"{PLANS[plan]}")
    sizes = {1: 6000, 4: 2000, 16: 600, 64: 150}  # CPU comes in 10 ms ticks: many calls
    need = sum(b * n for b, n in sizes.items())
    await conn.execute(
        "SELECT jobq.enqueue_many(array_fill('noop'::text, ARRAY[$1::int]), "
        "array_fill('{}'::jsonb, ARRAY[$1::int]), array_fill(0::float8, ARRAY[$1::int]), "
        "array_fill(NULL::text, ARRAY[$1::int]), 60)", need)
    ids = [r[0] for r in await conn.fetch("SELECT id FROM jobq.job ORDER BY created_at")]
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    out, pos = [], 0
    for size, calls in sizes.items():
        claim_s = complete_s = claim_wall = complete_wall = 0.0
        for _ in range(calls):
            batch, pos = ids[pos:pos + size], pos + size
            a, t = cpu_s(backend), time.perf_counter()
            rows = await conn.fetch(Q["claim"], batch, "bench", ["noop"],
                                    [uuid.uuid4() for _ in batch])
            b, t2 = cpu_s(backend), time.perf_counter()
            await conn.fetch(Q["complete"], [r["id"] for r in rows], [r["lock"] for r in rows],
                             [None] * len(rows))
            claim_s, claim_wall = claim_s + b - a, claim_wall + t2 - t
            complete_s += cpu_s(backend) - b
            complete_wall += time.perf_counter() - t2
        out.append({"batch": size, "calls": calls,
                    "claim_cpu_ms_per_call": claim_s / calls * 1e3,
                    "claim_cpu_ms_per_job": claim_s / calls / size * 1e3,
                    "claim_wall_ms_per_call": claim_wall / calls * 1e3,
                    "complete_cpu_ms_per_call": complete_s / calls * 1e3,
                    "complete_cpu_ms_per_job": complete_s / calls / size * 1e3,
                    "complete_wall_ms_per_call": complete_wall / calls * 1e3})
    await conn.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--plan", choices=("as-installed", *PLANS), default="as-installed")
    a = p.parse_args()
    with scratch(("noop",)) as (url, _amqp, _ns):
        rows = asyncio.run(measure(url, a.plan))
    print(f"plan: {a.plan}; one connection, no other load; server CPU from /proc")
    print("| batch | claim ms/call | claim ms/job | complete ms/call | complete ms/job |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']} | {r['claim_cpu_ms_per_call']:.3f} | {r['claim_cpu_ms_per_job']:.3f}"
              f" | {r['complete_cpu_ms_per_call']:.3f} | {r['complete_cpu_ms_per_job']:.3f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
