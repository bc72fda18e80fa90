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
import uuid
from typing import Any

import asyncpg
import pytest

from harness.plans import explain_generic
from jobq.db import SESSION_SETTINGS
from jobq.sql import BODY, FAST, GENERIC_PLAN, Q, statements

# Statement -> arguments naming up to 32 ids (the rest as a worker would pass them).
BY_ID: dict[str, Any] = {
    "mark_published": lambda ids: (ids, ids),
    "mark_republished": lambda ids: (ids, ids),
    "claim": lambda ids: (ids, "w", ["noop"], ids),
    "claim_recover": lambda ids: (ids, ids, "w"),
    "claim_misses": lambda ids: (ids,),
    "renew": lambda ids: (ids, ids, [30.0] * len(ids), "w"),
    "complete": lambda ids: (ids, ids, [None] * len(ids)),
    "finished_by": lambda ids: (ids, ids),
    "fail": lambda ids: (ids, ids, ["e"] * len(ids), [True] * len(ids), [None] * len(ids),
             ["tb"] * len(ids), [None] * len(ids), [None] * len(ids), [None] * len(ids)),
    "release": lambda ids: (ids, ids, "why", False),
    "cancel": lambda ids: (ids[0], "why"),
    "retry_failed": lambda ids: (ids[0], None),
    "job_get": lambda ids: (ids[0],),
    "relay_mark": lambda ids: (ids,),
    "lease_lost_event": lambda ids: (ids[0], ids[0], "why"),
    "isolate": lambda ids: (ids[0], ids[0]),
    "child_died": lambda ids: (ids[0], ids[0], "why"),
    "quarantine": lambda ids: (ids[0], "w", ["noop"], ids[0]),
}
ALLOWED_INDEXES = {"job_pkey", "queue_pkey", "worker_pkey", "job_event_pkey"}


def _indexes_and_scans(plan: Any) -> tuple[set[str], set[str]]:
    text = json.dumps(plan)
    indexes = set(re.findall(r'"Index Name": "([^"]+)"', text))
    seq = set(re.findall(r'"Node Type": "Seq Scan", [^{}]*?"Relation Name": "([^"]+)"', text))
    return indexes, seq | _unconditioned(plan)


def _unconditioned(plan: Any) -> set[str]:
    """Scans of jobq.job with no index condition: a walk of a whole index
    that filters every entry (issue #49: a completion read 3,674 buffers
    at 8,000 jobs, the claim 400, both growing with the table)."""
    found: set[str] = set()
    if isinstance(plan, dict):
        if (plan.get("Relation Name") == "job" and plan.get("Node Type") in (
                "Index Scan", "Index Only Scan") and "Index Cond" not in plan):
            found.add(f"job via {plan.get('Index Name')} without an index condition")
        for value in plan.values():
            found |= _unconditioned(value)
    elif isinstance(plan, list):
        for p in plan:
            found |= _unconditioned(p)
    return found


async def _load(conn: asyncpg.Connection, stats: str) -> list[Any]:
    """40 k jobs in every status, with statistics as ``stats`` says; 32 ids."""
    await conn.execute("INSERT INTO jobq.queue (name) VALUES ('noop')")
    if stats == "vacant":  # no row at all: the first call of a new deployment
        return [uuid.uuid4() for _ in range(32)]
    if stats in ("empty", "few"):  # as on a new deployment, after a TRUNCATE or a prune
        await conn.execute("VACUUM ANALYZE jobq.job")
    await conn.execute(
        "INSERT INTO jobq.job (queue, payload, status, lock, lease_expires_at, "
        "published_at, finished_at) "
        "SELECT 'noop', '{}', s, gen_random_uuid(), "
        "CASE WHEN s = 'active' THEN now() + interval '30 s' END, "
        "CASE WHEN s <> 'queued' OR i % 2 = 0 THEN now() END, "
        "CASE WHEN s IN ('completed', 'failed') THEN now() END "
        "FROM generate_series(1, $1) i, "
        "LATERAL (SELECT (ARRAY['queued','active','completed','failed'])[1 + i % 4] AS s)"
        " x", 40 if stats == "few" else 40000)
    if stats == "backlog":  # analyzed while everything was queued, then drained
        await conn.execute("UPDATE jobq.job SET status = 'queued', lease_expires_at = NULL")
        await conn.execute("ANALYZE jobq.job")
        await conn.execute(
            "UPDATE jobq.job SET status = CASE WHEN random() < 0.5 THEN 'completed' "
            "ELSE 'active' END, lease_expires_at = now() + interval '30 s', "
            "published_at = now() WHERE random() < 0.5")
    if stats == "fresh":
        await conn.execute("ANALYZE jobq.job")
    return [r["id"] for r in await conn.fetch(
        "SELECT id FROM jobq.job ORDER BY random() LIMIT 32")]


# Small tables a plan may read whole: queues, workers, the per-key rate
# buckets (keys active in the last hour; the reapers prune the rest) and the
# RateLimited holds (each RateLimited of a queue drops its expired ones).
SMALL = {"queue", "worker", "key_rate", "key_hold"}


# A retried claim finds the rows it took by their tokens among this worker's
# active rows (rare: a claim whose reply was lost): what runs, not the table.
WALKS = {"claim_recover": {"job via job_active_idx without an index condition"}}


def _bad(plans: dict[str, tuple[set[str], set[str]]],
         extra: dict[str, set[str]]) -> dict[str, Any]:
    return {name: (sorted(ix - ALLOWED_INDEXES - extra.get(name, set())),
                   sorted(seq - SMALL - WALKS.get(name, set())))
            for name, (ix, seq) in plans.items()
            if ix - ALLOWED_INDEXES - extra.get(name, set())
            or seq - SMALL - WALKS.get(name, set())}


@pytest.mark.parametrize("stats", ["empty", "backlog", "fresh"])
def test_statements_by_id_use_the_primary_key(db_url: str, stats: str) -> None:
    assert set(BY_ID) <= set(Q), "a statement in this test no longer exists"

    async def go() -> dict[str, tuple[set[str], set[str]]]:
        conn = await asyncpg.connect(db_url, server_settings=SESSION_SETTINGS)
        try:
            ids = await _load(conn, stats)
            plans = {}
            for name, args in BY_ID.items():
                last = statements(BODY[name])[-1]
                raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {last}", *args(ids))
                plans[name] = _indexes_and_scans(json.loads(raw) if isinstance(raw, str) else raw)
            return plans
        finally:
            await conn.close()

    # The claim counts a limited queue's active jobs (max_running) through the
    # partial index of active rows, as its status test there says; its rows
    # by id still go through the key.
    bad = _bad(asyncio.run(go()), {
        "claim": {"job_active_idx", "job_active_key_idx", "job_priority_idx", "key_rate_pkey",
                  "key_lock_pkey", "key_hold_live_idx", "job_key_seq_idx",
                  "job_queued_idx",  # aging's 64 longest due (schema 0040), bounded
                  "job_key_open_seq_idx"},  # a fifo job's live elders (0041)
        # a job of a fifo or latest queue looks for its key's other jobs
        # (schema 0027); every other row is read by its id
        "renew": {"job_key_seq_idx"}, "complete": {"job_key_seq_idx"},
        # a row claimed in place of a delivered id is found by its token among
        # this worker's active rows (rare: a claim retried after a lost reply)
        "claim_recover": {"job_active_idx"}})
    assert not bad, f"statements naming rows by id planned through other paths: {bad}"


# "few": the plan made while the table holds a few rows, as a session's
# first call after a fresh install, a TRUNCATE or a prune makes it; a
# generic plan is then kept for the session's life (issue #49: the
# completion's walked the whole primary key, 3,674 buffers at 8,000 jobs).
@pytest.mark.parametrize("stats", ["vacant", "empty", "few", "backlog", "fresh"])
def test_generic_plans_go_through_the_primary_key_whatever_the_statistics(
        db_url: str, stats: str) -> None:
    """The functions that keep one plan per session (``-- plan: generic``)
    plan every statement of theirs through the primary key: planned without
    the arguments, as the function plans them, with the function's settings.
    Each statement is prepared with the function's own parameter types, so
    one that uses only some of them (the claim's queue lock) is checked too."""
    assert set(BY_ID) >= GENERIC_PLAN, "every generic-plan statement needs arguments here"

    async def go() -> dict[str, tuple[set[str], set[str]]]:
        conn = await asyncpg.connect(db_url, server_settings=SESSION_SETTINGS)
        try:
            ids = await _load(conn, stats)
            plans: dict[str, tuple[set[str], set[str]]] = {}
            for name in sorted(GENERIC_PLAN):
                args = BY_ID[name](ids)
                lean = statements(BODY[FAST[name]]) if name in FAST else []  # (sql.py)
                for stmt in statements(BODY[name]) + lean:
                    ix, seq = _indexes_and_scans(await explain_generic(conn, name, stmt, args))
                    had = plans.get(name, (set(), set()))
                    plans[name] = (had[0] | ix, had[1] | seq)
            return plans
        finally:
            await conn.close()

    bad = _bad(asyncio.run(go()), {
        "claim": {"job_active_idx", "job_active_key_idx", "job_priority_idx", "key_rate_pkey",
                  "key_lock_pkey", "key_hold_live_idx", "job_key_seq_idx",
                  "job_queued_idx",  # aging's 64 longest due (schema 0040), bounded
                  "job_key_open_seq_idx"},  # a fifo job's live elders (0041)
        # a job of a fifo or latest queue looks for its key's other jobs
        # (schema 0027); every other row is read by its id
        "renew": {"job_key_seq_idx"}, "complete": {"job_key_seq_idx"},
        # a row claimed in place of a delivered id is found by its token among
        # this worker's active rows (rare: a claim retried after a lost reply)
        "claim_recover": {"job_active_idx"}})
    assert not bad, f"generic plans of statements by id through other paths: {bad}"


# The reapers' polling statements with their arguments: each must stay a
# probe (a few index entries per queue), however large the backlog and
# however stale the statistics about it.
PROBES: dict[str, tuple[Any, ...]] = {
    "sweep_probe": (),
    "lost_candidates": (0.0,),  # every published row is "a while ago"
    "lost_horizon": ("noop", 0.0, False),
}


def _rows_read(plan: Any) -> int:
    """Rows that scans of jobq.job produced, over the whole plan."""
    total = 0
    if isinstance(plan, dict):
        if plan.get("Relation Name") == "job":
            total += int(plan.get("Actual Rows", 0)) * int(plan.get("Actual Loops", 1))
        for value in plan.values():
            total += _rows_read(value)
    elif isinstance(plan, list):
        total += sum(_rows_read(p) for p in plan)
    return total


ACTIVE = 20  # what runs: the probes may read that much (bounded by the fleet)


async def _backlog(conn: asyncpg.Connection, stats: str) -> None:
    """40 k jobs queued and published a minute ago, ACTIVE running, 10 k asleep."""
    await conn.execute("INSERT INTO jobq.queue (name) VALUES ('noop')")
    if stats == "empty":  # analyzed while empty: the planner believes it still is
        await conn.execute("VACUUM ANALYZE jobq.job")
    await conn.execute(
        "INSERT INTO jobq.job (queue, payload, status, lock, run_at, published_at, "
        "lease_expires_at, started_at) "
        "SELECT 'noop', '{}', CASE WHEN i <= $1 THEN 'active' ELSE 'queued' END, "
        "gen_random_uuid(), now() - interval '2 min', now() - interval '1 min', "
        "CASE WHEN i <= $1 THEN now() + interval '30 s' END, "
        "CASE WHEN i <= $1 THEN now() END FROM generate_series(1, 40000) i", ACTIVE)
    # and 10 k asleep (job.sleep, issue #52): unpublished, due in an hour; the
    # probe's earliest relay time read each of them (a min() over the index)
    await conn.execute(
        "INSERT INTO jobq.job (queue, payload, run_at, relay_after, started_at, suspended_at) "
        "SELECT 'noop', '{}', now() + interval '1 h', now() + interval '1 h', now(), now() "
        "FROM generate_series(1, 10000)")
    if stats == "fresh":
        await conn.execute("ANALYZE jobq.job")


@pytest.mark.parametrize("stats", ["empty", "fresh"])
def test_the_reapers_probes_read_what_runs_not_the_backlog(db_url: str, stats: str) -> None:
    """Found by bench/backlog.py: with 1 M jobs queued and no ANALYZE since,
    lost_candidates (then an EXISTS) hashed every waiting row, 370 ms every
    5 s per reaper; as a LATERAL ... LIMIT 1 it reads one. What runs (the
    earliest lease deadline) they may read: the fleet bounds it."""
    assert set(PROBES) <= set(Q), "a statement in this test no longer exists"

    async def go() -> dict[str, int]:
        conn = await asyncpg.connect(db_url, server_settings=SESSION_SETTINGS)
        try:
            await _backlog(conn, stats)
            read = {}
            for name, args in PROBES.items():
                raw = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {Q[name]}", *args)
                read[name] = _rows_read(json.loads(raw) if isinstance(raw, str) else raw)
            return read
        finally:
            await conn.close()

    read = asyncio.run(go())
    assert max(read.values()) <= 2 * ACTIVE + 10, f"rows of jobq.job read per probe: {read}"


@pytest.mark.parametrize("stats", ["empty", "fresh"])
def test_the_supersede_duty_reads_a_keys_queued_jobs_not_its_history(
        db_url: str, stats: str) -> None:
    """The reapers' supersede duty (schema 0042) for a latest key with 10,000
    ended jobs kept, 3 queued: it reads the key's newest job and its queued
    ones, never the ended history (a walk of job_key_seq_idx would)."""
    async def go() -> tuple[int, int]:
        conn = await asyncpg.connect(db_url, server_settings=SESSION_SETTINGS)
        try:
            await conn.execute("INSERT INTO jobq.queue (name, key_policy) VALUES ('lt', 'latest')")
            if stats == "empty":
                await conn.execute("VACUUM ANALYZE jobq.job")
            await conn.execute("SELECT count(*) FROM (SELECT jobq.enqueue('lt', '{}', key => 'k', "
                               "relay_grace_s => 60) FROM generate_series(1, 10003)) s")
            await conn.execute("UPDATE jobq.job SET status = 'completed', finished_at = now() "
                               "WHERE seq < (SELECT max(seq) - 2 FROM jobq.job)")
            if stats == "fresh":
                await conn.execute("ANALYZE jobq.job")
            raw = await conn.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {Q['supersede_pending']}", 1000)
            left = await conn.fetchval("SELECT count(*) FROM jobq.job WHERE status = 'queued'")
            return _rows_touched(json.loads(raw) if isinstance(raw, str) else raw), left
        finally:
            await conn.close()

    read, left = asyncio.run(go())
    assert left == 1, "the two older queued jobs were not superseded"
    assert read <= 10, f"rows of jobq.job read by the supersede duty: {read}"


def _rows_touched(plan: Any) -> int:
    """As _rows_read, with the rows its scans of jobq.job read and filtered out."""
    total = 0
    if isinstance(plan, dict):
        if plan.get("Relation Name") == "job":
            total += (int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
                      ) * int(plan.get("Actual Loops", 1))
        total += sum(_rows_touched(v) for v in plan.values())
    elif isinstance(plan, list):
        total += sum(_rows_touched(p) for p in plan)
    return total
