"""The workers' batch statements (mark_published, claim, complete, renew, fail,
release) do work in proportion to the batch, not to its square (issue #49).

Found by EXPLAIN ANALYZE of the completion's generic plan: joined to the
batch as ``unnest($1, $2, $3)``, the update rescanned the batch once per row
(a nested loop, 4,032 rows filtered away for 64 jobs), and the same with the
locked rows in place of unnest(). Each statement is run here as its function
runs it (its generic plan, with its settings) for 16 and for 128 jobs: the
rows its repeated scans and join filters produce must stay a few per job,
where a rescan of the batch per row makes them the batch size per job.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from harness.plans import explain_generic
from jobq.db import SESSION_SETTINGS
from jobq.sql import BODY, FAST, Q, statements


def _work(plan: Any) -> int:
    """Rows that nodes run more than once produced or filtered away, over all
    their loops, and rows any join filtered away: an index lookup per job
    adds 1 a job, a batch scanned again for every row of another adds the
    batch for every row (a scan run once, whatever its shape, is not work
    of this kind: a plan for more rows may add a sort or a bitmap)."""
    total = 0
    if isinstance(plan, dict):
        loops = int(plan.get("Actual Loops", 1))
        if loops > 1:
            total += loops * sum(int(plan.get(k, 0)) for k in (
                "Actual Rows", "Rows Removed by Filter", "Rows Removed by Index Recheck"))
        total += loops * int(plan.get("Rows Removed by Join Filter", 0))
        total += sum(_work(v) for v in plan.values())
    elif isinstance(plan, list):
        total += sum(_work(p) for p in plan)
    return total


PER_JOB = 4  # repeated-scan rows a job may cost: a lookup or two (the batch: squared)


async def _analyzed(conn: asyncpg.Connection, name: str, stmt: str,
                    args: tuple[Any, ...]) -> Any:
    """Run as its function runs it (its generic plan), rolled back; the plan."""
    return await explain_generic(conn, name, stmt, args, analyze=True)


async def _queued(conn: asyncpg.Connection, n: int) -> list[uuid.UUID]:
    ids = [r[0] for r in await conn.fetch(
        "SELECT id FROM jobq.enqueue_many(array_fill('noop'::text, ARRAY[$1::int]), "
        "array_fill('{}'::jsonb, ARRAY[$1::int]), array_fill(0::float8, ARRAY[$1::int]), "
        "array_fill(NULL::text, ARRAY[$1::int]), 60)", n)]
    return sorted(ids)


async def _work_of(conn: asyncpg.Connection, n: int) -> dict[str, int]:
    ids = await _queued(conn, n)
    tokens = [uuid.uuid4() for _ in ids]
    out = {"mark_published": _work(await _analyzed(conn, "mark_published",
                                                  BODY["mark_published"], (ids, [None] * n)))}
    claim = statements(BODY[FAST["claim"]])[-1]  # what an unlimited queue's claim runs
    out["claim"] = _work(await _analyzed(conn, "claim", claim, (ids, "w", ["noop"], tokens)))
    rows = await conn.fetch(Q["claim"], ids, "w", ["noop"], tokens)
    assert len(rows) == n
    rows = sorted(rows, key=lambda r: r["id"])
    done = (([r["id"] for r in rows], [r["lock"] for r in rows], [None] * n))
    out["complete"] = _work(await _analyzed(conn, "complete", BODY["complete"], done))
    ids, locks = done[0], done[1]
    out["renew"] = _work(await _analyzed(conn, "renew", BODY["renew"],
                                        (ids, locks, [30.0] * n, "w")))
    out["fail"] = _work(await _analyzed(conn, "fail", BODY["fail"], (
        ids, locks, ["e"] * n, [True] * n, [None] * n, ["tb"] * n, [None] * n, [None] * n,
        [None] * n)))
    out["release"] = _work(await _analyzed(conn, "release", BODY["release"],
                                          (ids, locks, "why", False)))
    return out


# "empty": analyzed empty, the statistics of a new install; "kept": 20,000
# finished jobs retained and analyzed, the table of a service that has run.
@pytest.mark.parametrize("stats", ["empty", "kept"])
def test_a_workers_batch_statements_work_grows_with_the_batch_not_its_square(
        db_url: str, stats: str) -> None:
    async def go() -> tuple[dict[str, int], dict[str, int]]:
        conn = await asyncpg.connect(db_url, server_settings=SESSION_SETTINGS)
        try:
            await conn.execute("INSERT INTO jobq.queue (name) VALUES ('noop')")
            if stats == "kept":
                await conn.execute(
                    "INSERT INTO jobq.job (queue, payload, status, finished_at) "
                    "SELECT 'noop', '{}', 'completed', now() FROM generate_series(1, 20000)")
            await conn.execute("ANALYZE jobq.job")
            return await _work_of(conn, 16), await _work_of(conn, 128)
        finally:
            await conn.close()

    small, large = asyncio.run(go())
    per_job = {name: (round(small[name] / 16, 1), round(large[name] / 128, 1)) for name in small}
    assert all(a <= PER_JOB and b <= PER_JOB for a, b in per_job.values()), (
        f"rows of repeated scans and join filters per job, at 16 and at 128 jobs (a few "
        f"is a lookup per job, the batch size is a rescan per row): {per_job}")
