"""What planning costs the producer's group commit (issue #49, schema 0044):
a one-job ``jobq.enqueue_many`` with its commit, planned on every call
against one plan per session, interleaved rounds in one sitting.

    .venv/bin/python bench/enqueue_plan.py [--rounds 3] [--calls 350]

Per round and setting: the function's plan setting is switched by ALTER
FUNCTION ("custom": plan_cache_mode = force_custom_plan, what schema 0010
installed; "generic": force_generic_plan with sequential scans priced out,
what schema 0044 installs), then a new session makes 50 calls of warm-up and
--calls timed ones, one after another (a prepared statement, autocommit, a
2 ms pause between calls). A plain INSERT into jobq.job is timed the same
way for scale. Prints p50 and p99 (ms, the caller's clock) and the
generic/custom ratio of the p50s per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import scratch
from detection import pct

from jobq.db import SESSION_SETTINGS

FUNCTION = ("jobq.enqueue_many(text[], jsonb[], double precision[], text[], "
            "double precision, integer[], text[], double precision[])")
SETTINGS = {"custom": ("plan_cache_mode = force_custom_plan", "enable_seqscan = on"),
            "generic": ("plan_cache_mode = force_generic_plan", "enable_seqscan = off")}
CALL = "SELECT id FROM jobq.enqueue_many(ARRAY['noop'], ARRAY['{}'::jsonb], relay_grace_s => 5)"
INSERT = "INSERT INTO jobq.job (queue, payload) VALUES ('noop', '{}') RETURNING id"
WARM_UP = 50


async def timed(url: str, sql: str, calls: int) -> dict[str, float]:
    conn = await asyncpg.connect(url, server_settings=SESSION_SETTINGS)
    try:
        stmt = await conn.prepare(sql)
        ms = []
        for i in range(WARM_UP + calls):
            t = time.perf_counter()
            await stmt.fetch()
            if i >= WARM_UP:
                ms.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.002)
    finally:
        await conn.close()
    return {"p50": round(statistics.median(ms), 3), "p99": round(pct(ms, 0.99), 3)}


async def run(url: str, rounds: int, calls: int) -> dict[str, object]:
    admin = await asyncpg.connect(url)
    await admin.execute("INSERT INTO jobq.queue (name) VALUES ('noop')")
    out: list[dict[str, object]] = []
    try:
        for _ in range(rounds):
            row: dict[str, object] = {}
            for name, settings in SETTINGS.items():
                for setting in settings:
                    await admin.execute(f"ALTER FUNCTION {FUNCTION} SET {setting}")
                row[name] = await timed(url, CALL, calls)
            row["plain_insert"] = await timed(url, INSERT, calls)
            gen, cus = row["generic"], row["custom"]
            assert isinstance(gen, dict) and isinstance(cus, dict)
            row["generic_over_custom_p50"] = round(gen["p50"] / cus["p50"], 3)
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        await admin.close()
    return {"calls": calls, "rounds": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=350)
    a = ap.parse_args()
    with scratch(("noop",)) as (db_url, _amqp, _ns):
        print(json.dumps(asyncio.run(run(db_url, a.rounds, a.calls)), indent=2))


if __name__ == "__main__":
    main()
