"""Worker writes go through the primary key, whatever the statistics say.

Found by the drain benchmark: after `VACUUM ANALYZE` of an empty table (a new
deployment), 60 k jobs were published and the planner, believing the partial
index on queued rows almost empty, claimed 10 ids by walking job_queued_idx
(15,658 rows filtered for 10 claims); completions walked job_active_idx and
its dead entries the same way. Drain fell from ~3,000 to ~1,700 jobs/s and
PostgreSQL used 140 % CPU. Every statement that names its rows by id must
plan as primary-key lookups, with stale statistics as with fresh ones.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import asyncpg
import pytest

from jobq.db import SESSION_SETTINGS
from jobq.sql import BODY, Q, statements

# Statement -> arguments naming up to 32 ids (the rest as a worker would pass them).
BY_ID: dict[str, Any] = {
    "mark_published": lambda ids: (ids, ids),
    "claim": lambda ids: (ids, "w", ["noop"], ids),
    "claim_recover": lambda ids: (ids, ids, "w"),
    "claim_misses": lambda ids: (ids,),
    "hand_back": lambda ids: (ids,),
    "renew": lambda ids: (ids, ids, [30.0] * len(ids), "w"),
    "complete": lambda ids: (ids, ids, [None] * len(ids)),
    "finished_by": lambda ids: (ids, ids),
    "fail": lambda ids: (ids, ids, ["e"] * len(ids), [True] * len(ids), [None] * len(ids)),
    "release": lambda ids: (ids, ids, "why", False),
    "cancel": lambda ids: (ids[0], "why"),
    "retry_failed": lambda ids: (ids[0], None),
    "job_get": lambda ids: (ids[0],),
    "relay_mark": lambda ids: (ids,),
    "lease_lost_event": lambda ids: (ids[0], "w", 1, "why"),
    "isolate": lambda ids: (ids[0], ids[0]),
    "child_died": lambda ids: (ids[0], ids[0], "why"),
    "quarantine": lambda ids: (ids[0], "why"),
}
ALLOWED_INDEXES = {"job_pkey", "queue_pkey", "worker_pkey", "job_event_pkey"}


def _indexes_and_scans(plan: Any) -> tuple[set[str], set[str]]:
    text = json.dumps(plan)
    indexes = set(re.findall(r'"Index Name": "([^"]+)"', text))
    seq = set(re.findall(r'"Node Type": "Seq Scan", [^{}]*?"Relation Name": "([^"]+)"', text))
    return indexes, seq


@pytest.mark.parametrize("stats", ["empty", "backlog", "fresh"])
def test_statements_by_id_use_the_primary_key(db_url: str, stats: str) -> None:
    assert set(BY_ID) <= set(Q), "a statement in this test no longer exists"

    async def go() -> dict[str, tuple[set[str], set[str]]]:
        conn = await asyncpg.connect(db_url, server_settings=SESSION_SETTINGS)
        try:
            await conn.execute("INSERT INTO jobq.queue (name) VALUES ('noop')")
            if stats == "empty":  # as on a new deployment
                await conn.execute("VACUUM ANALYZE jobq.job")
            await conn.execute(
                "INSERT INTO jobq.job (queue, payload, status, lock, lease_expires_at, "
                "published_at, finished_at) "
                "SELECT 'noop', '{}', s, gen_random_uuid(), "
                "CASE WHEN s = 'active' THEN now() + interval '30 s' END, "
                "CASE WHEN s <> 'queued' OR i % 2 = 0 THEN now() END, "
                "CASE WHEN s IN ('completed', 'failed') THEN now() END "
                "FROM generate_series(1, 40000) i, "
                "LATERAL (SELECT (ARRAY['queued','active','completed','failed'])[1 + i % 4] AS s)"
                " x")
            if stats == "backlog":  # analyzed while everything was queued, then drained
                await conn.execute("UPDATE jobq.job SET status = 'queued', lease_expires_at = NULL")
                await conn.execute("ANALYZE jobq.job")
                await conn.execute(
                    "UPDATE jobq.job SET status = CASE WHEN random() < 0.5 THEN 'completed' "
                    "ELSE 'active' END, lease_expires_at = now() + interval '30 s', "
                    "published_at = now() WHERE random() < 0.5")
            if stats == "fresh":
                await conn.execute("ANALYZE jobq.job")
            ids = [r["id"] for r in await conn.fetch(
                "SELECT id FROM jobq.job ORDER BY random() LIMIT 32")]
            plans = {}
            for name, args in BY_ID.items():
                last = statements(BODY[name])[-1]
                raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {last}", *args(ids))
                plans[name] = _indexes_and_scans(json.loads(raw) if isinstance(raw, str) else raw)
            return plans
        finally:
            await conn.close()

    plans = asyncio.run(go())
    # claim counts a limited queue's active jobs (max_running) through the
    # partial index of active rows; its rows by id still go through the key.
    extra = {"claim": {"job_active_idx"}}
    bad = {name: (sorted(ix - ALLOWED_INDEXES - extra.get(name, set())),
                  sorted(seq - {"queue", "worker"}))
           for name, (ix, seq) in plans.items()
           if ix - ALLOWED_INDEXES - extra.get(name, set()) or seq - {"queue", "worker"}}
    assert not bad, f"statements naming rows by id planned through other paths: {bad}"
