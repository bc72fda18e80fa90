"""Connections whose backend is terminated are never reused (issue #19).

Reproduces the driver state behind "InternalClientError: cannot switch to
state 12; another operation (2) is in progress": a backend terminated while
its connection is idle in the pool sends a FATAL error that asyncpg reads
into an error-consuming state; the pool's light reset does not notice, and
the next borrower's statement fails with a *non-transient* internal error,
which the finishing write did not retry."""

from __future__ import annotations

import asyncio
import collections

import asyncpg

from jobq import db as jdb
from jobq.errors import DatabaseUnavailable


async def _hammer(url: str, use: str) -> collections.Counter[str]:
    pool = await jdb.connect_once(url, min_size=8, max_size=8, app_name="jobq-kill-probe",
                                  check_schema=False)
    admin = await asyncpg.connect(url)
    seen: collections.Counter[str] = collections.Counter()

    async def op() -> None:
        try:
            if use == "jobq":
                await jdb.fetchval(pool, "SELECT $1::int + 1", 1)
            else:
                await pool.fetchval("SELECT $1::int + 1", 1)
            seen["ok"] += 1
        except Exception as exc:
            seen[type(exc).__name__] += 1
            if "released back to the pool" in str(exc):  # a masked cause (issue #29)
                seen["masked"] += 1

    try:
        for _ in range(30):
            kill = asyncio.create_task(admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'jobq-kill-probe' AND datname = current_database()"))
            for _ in range(5):
                await asyncio.gather(*(op() for _ in range(8)))
            await kill
    finally:
        await pool.close()
        await admin.close()
    return seen


def test_terminated_backends_only_ever_give_transient_errors(db_url: str) -> None:
    seen = asyncio.run(_hammer(db_url, "jobq"))
    assert seen["ok"] > 0 and seen["DatabaseUnavailable"] > 0, seen  # the kills did land
    # Each error says its real cause: terminating a connection asyncpg had
    # already released raised "released back to the pool" in its place.
    assert set(seen) == {"ok", "DatabaseUnavailable"}, seen


def test_the_bare_pool_reuses_broken_connections(db_url: str) -> None:
    """The failure mode itself, so the test above is known to be able to fail."""
    seen = asyncio.run(_hammer(db_url, "bare"))
    assert seen["InternalClientError"] > 0, seen


def test_a_terminated_statement_is_translated_as_unavailable(db_url: str) -> None:
    async def go() -> None:
        pool = await jdb.connect_once(db_url, app_name="jobq-kill-probe2", check_schema=False)
        admin = await asyncpg.connect(db_url)
        try:
            pid = await jdb.fetchval(pool, "SELECT pg_backend_pid()")
            slow = asyncio.create_task(jdb.fetch(pool, "SELECT pg_sleep(2)"))
            await asyncio.sleep(0.2)
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
            try:
                await slow
            except DatabaseUnavailable:
                pass
            else:
                raise AssertionError("a terminated statement must raise DatabaseUnavailable")
            assert await jdb.fetchval(pool, "SELECT 1") == 1  # a fresh connection
        finally:
            await pool.close()
            await admin.close()

    asyncio.run(go())
