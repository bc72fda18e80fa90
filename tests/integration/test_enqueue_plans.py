"""The producer's group commit, jobq.enqueue_many, keeps one plan per
session and none of its statements reads jobq.job (schema 0044, issue #49).

Planned on every call, planning was most of a one-job publish's server time
(1.09 ms against 0.69 ms with one plan per session). One plan per session
is safe only because nothing in the function scans jobq.job: a plan made
while the table was empty (a new install) then stays right however the
table grows. Every statement the call runs, the triggers' with them, is
logged with its plan (auto_explain, nested statements): the insert's plan
must be the generic one (the arguments as parameters, not as constants),
and no plan may scan jobq.job or read any table sequentially.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from jobq.db import SESSION_SETTINGS

CALLS = 7  # past the five custom plans PostgreSQL's "auto" mode would make first


def _nodes(plan: Any) -> list[dict[str, Any]]:
    out = [plan]
    for sub in plan.get("Plans", []):
        out.extend(_nodes(sub))
    return out


async def _plans_of_last_call(conn: asyncpg.Connection, grace: float) -> list[dict[str, Any]]:
    logged: list[str] = []
    for i in range(CALLS):
        if i == CALLS - 1:
            conn.add_log_listener(lambda _c, m: logged.append(m.message))
        await conn.fetch("SELECT id FROM jobq.enqueue_many(ARRAY['noop'], "
                         "ARRAY['{\"n\": 1}'::jsonb], relay_grace_s => $1)", grace)
    await asyncio.sleep(0.1)  # the log messages arrive before the reply; let them be read
    plans = []
    for m in logged:
        if m.startswith("duration:") and "{" in m:
            plans.append(json.loads(m[m.index("{"):]))
    return plans


def test_enqueue_many_keeps_one_plan_and_reads_no_job_row(db_url: str) -> None:
    async def go() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(db_url, server_settings=SESSION_SETTINGS)
        try:
            await conn.execute("INSERT INTO jobq.queue (name) VALUES ('noop')")
            await conn.execute("ANALYZE jobq.job")  # a new install's statistics: empty
            await conn.execute("LOAD 'auto_explain'")
            for setting in ("log_min_duration = 0", "log_nested_statements = on",
                            "log_verbose = on", "log_format = json"):
                await conn.execute(f"SET auto_explain.{setting}")
            await conn.execute("SET client_min_messages = log")
            return [*await _plans_of_last_call(conn, 60), *await _plans_of_last_call(conn, 0)]
        finally:
            await conn.close()

    plans = asyncio.run(go())
    texts = [p["Query Text"] for p in plans]
    inserts = [p for p in plans if "INSERT INTO jobq.job " in p["Query Text"]]
    assert len(inserts) == 2 and any("pg_notify" in t for t in texts), texts
    for p in inserts:
        calls = [n["Function Call"] for n in _nodes(p["Plan"]) if "Function Call" in n]
        assert calls and all("$1" in c for c in calls), (
            f"the insert was planned for this call's arguments, not once a session: {calls}")
    for p in plans:
        for n in _nodes(p["Plan"]):
            assert n["Node Type"] != "Seq Scan", (n.get("Relation Name"), p["Query Text"])
            assert not (n.get("Relation Name") == "job" and "Scan" in n["Node Type"]), (
                f"reads jobq.job: {n['Node Type']} in {p['Query Text'][:200]}")
