"""Migrations and the SQL contract, on a real PostgreSQL."""

from __future__ import annotations

import asyncio

import asyncpg

from harness.scratch import admin as _admin
from harness.scratch import with_db as _with_db
from jobq.ops import migrate
from jobq.sql import Q


def test_every_query_prepares_against_the_migrated_schema(db_url: str) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(db_url)
        try:
            for name, sql in Q.items():
                try:
                    await conn.prepare(sql)
                except asyncpg.PostgresError as exc:
                    raise AssertionError(f"query {name!r} does not prepare: {exc}") from exc
        finally:
            await conn.close()

    asyncio.run(go())


def test_migrate_is_idempotent_and_safe_concurrently(pg_admin_url: str) -> None:
    name = "jobq_migrate_probe_" + __import__("uuid").uuid4().hex[:8]

    async def go() -> None:
        await _admin(pg_admin_url, f"CREATE DATABASE {name}")
        url = _with_db(pg_admin_url, name)
        try:
            c1, c2 = await asyncpg.connect(url), await asyncpg.connect(url)
            applied = await asyncio.gather(migrate.apply(c1), migrate.apply(c2))
            assert sorted(len(a) for a in applied) == [0, len(migrate.load())]
            assert await migrate.apply(c1) == []
            versions = await c1.fetch("SELECT version FROM jobq.schema_migration")
            assert len(versions) == len(migrate.load())
            cols = {r["column_name"] for r in await c1.fetch(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'jobq' AND table_name = 'job'")}
            assert {"id", "queue", "payload", "status", "lock", "lease_expires_at", "attempts",
                    "stalls", "last_error", "created_at"} <= cols
            views = {r["table_name"] for r in await c1.fetch(
                "SELECT table_name FROM information_schema.views WHERE table_schema = 'jobq'")}
            assert {"queue_stats", "stalled", "running", "failed"} <= views
            await c1.close()
            await c2.close()
        finally:
            await _admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    asyncio.run(go())
