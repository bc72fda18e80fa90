"""What a pool acquire and release adds to a statement, in the caller's CPU
(issue #37): ``jobq.db.fetch`` on the pool (how the consumer sends each claim
and completion batch) against the same statement on a connection held.

    .venv/bin/python bench/pool_cost.py [--statements 5000] [--rounds 3]

One process, uvloop, a pool built as jobq's (``open_pool``: the light reset
on release); the statement is ``SELECT $1::int`` so that the server's share
is as small as it gets and the difference is the client's. Rounds alternate
the two ways; the figure is this process's CPU (user + system) per
statement, medians over rounds, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics

import uvloop

from jobq.db import fetch, open_pool

URL = os.environ.get("JOBQ_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main(statements: int, rounds: int) -> None:
    pool = await open_pool(URL, wait=False, min_size=2, max_size=4, app_name="jobq-bench",
                           check_schema=False)
    held = await pool.acquire()
    per: dict[str, list[float]] = {"pool": [], "held": []}
    try:
        for _ in range(statements // 10):  # warm both: statement cache, pool
            await fetch(pool, "SELECT $1::int", 1)
            await fetch(held, "SELECT $1::int", 1)
        for _ in range(rounds):
            for way, db in (("pool", pool), ("held", held)):
                c0 = cpu()
                for _ in range(statements):
                    await fetch(db, "SELECT $1::int", 1)
                per[way].append((cpu() - c0) / statements * 1e6)
    finally:
        await pool.release(held)
        await pool.close()
    print(f"{statements} statements a round, {rounds} rounds; caller's CPU per statement (µs)")
    for way, xs in per.items():
        print(f"  {way:5} median {statistics.median(xs):6.1f}   rounds "
              + ", ".join(f"{x:.1f}" for x in xs))
    print(f"  pool / held {statistics.median(per['pool']) / statistics.median(per['held']):.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--statements", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    uvloop.run(main(args.statements, args.rounds))
