"""PostgreSQL access: pools, start-up retries, and the one gateway every
statement goes through (errors translated by db_errors.py).

Services (consumer, reaper) call :func:`open_pool` with ``wait=True``: while
the database is down or not migrated yet they log one line per attempt and
keep trying, so an orchestrator starting everything at once sees no crash
loop. CLI commands use ``wait=False`` and fail with one line instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg

from jobq.db_errors import (
    TRANSIENT,
    _login,
    certificate_refused,
    is_data_error,
    is_transient,
    missing_right,
    pg_message,
    session_broken,
    translated,
)
from jobq.endpoints import redact
from jobq.errors import ConfigError, DatabaseUnavailable, SchemaMissing
from jobq.runtime.backoff import Backoff
from jobq.sql import Q

# The error helpers live in db_errors.py; callers keep importing them from here.
__all__ = [
    "SESSION_SETTINGS",
    "TRANSIENT",
    "Database",
    "PooledConnection",
    "certificate_refused",
    "connect_once",
    "connection",
    "execute",
    "fetch",
    "fetchrow",
    "fetchval",
    "is_data_error",
    "is_transient",
    "missing_right",
    "open_pool",
    "pg_message",
    "prepare",
    "session_broken",
    "transaction",
    "translated",
    "warnings_logged",
]

log = logging.getLogger("jobq.db")

# What pool.acquire() hands out (a proxy with a Connection's methods); generic
# only in the type stubs.
if TYPE_CHECKING:
    PooledConnection = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]
else:
    PooledConnection = asyncpg.pool.PoolConnectionProxy

Init = Callable[[asyncpg.Connection], Coroutine[Any, Any, None]]  # a new session's set-up

# Plan every statement for its actual arguments. A generic plan cached while
# jobq.job was empty (a fresh deployment, a test) keeps sequential scans long
# after the table grew: measured 3x slower end to end at 20 k rows.
# No JIT: every jobq statement is short; compiling one cost more than running
# it (the dashboard's queue counts: 350 ms of JIT for 30 ms of work on a
# 1 M-row table, bench/dashboard.py).
SESSION_SETTINGS = {"plan_cache_mode": "force_custom_plan", "jit": "off"}


async def _light_reset(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default reset query (one round trip per
    statement): jobq's pooled sessions set no session state, hold no
    advisory locks (the worker registry has its own connection) and never
    LISTEN. Only a transaction left open by mistake is rolled back."""
    if conn.is_in_transaction():
        await conn.execute(Q["rollback"])


async def _check_schema(conn: asyncpg.Connection | PooledConnection) -> None:
    if await conn.fetchval(Q["schema_present"]) is None:
        name = await conn.fetchval(Q["database_name"])
        raise SchemaMissing(f"database {name} has no jobq schema yet: run `jobq migrate` "
                            "against it (or point JOBQ_DATABASE_URL at the migrated one)")


async def connect_once(
    url: str, *, min_size: int = 1, max_size: int = 4, app_name: str = "jobq",
    idle_in_tx_s: float | None = None, check_schema: bool = True, role: str | None = None,
    pooled: bool = False, init: Init | None = None, index_paths: bool = False,
) -> asyncpg.Pool:
    settings = {"application_name": app_name, **SESSION_SETTINGS}
    if index_paths:
        # Every statement of this pool is meant to read what runs or what is
        # due through a partial index, never the table: with statistics
        # gathered while the table was small (a fresh install, a TRUNCATE, a
        # prune), the planner chose sequential scans and the reapers' probe
        # read the whole table every sweep (issue #49: 951 buffers a probe at
        # 8,000 jobs). A table with no index is still scanned.
        settings["enable_seqscan"] = "off"
    if role:  # every session of the pool runs as this (group) role: SET ROLE at login
        settings["role"] = role
    _login[:] = [urlsplit(url).username or os.environ.get("PGUSER") or getpass.getuser()]
    if idle_in_tx_s:
        # A frozen process must not keep row locks for long (reaper relay).
        settings["idle_in_transaction_session_timeout"] = str(int(idle_in_tx_s * 1000))
    if pooled:
        # Behind PgBouncer in transaction mode, consecutive transactions may
        # run on different server sessions: a prepared statement kept by
        # name would be missing on the next one (asyncpg then prepares
        # unnamed statements each time), and PgBouncer refuses startup
        # parameters it does not know (set jit, timeouts on the role).
        settings = {"application_name": app_name}
    try:
        with translated():
            pool = await asyncpg.create_pool(
                url, min_size=min_size, max_size=max_size, reset=_light_reset, init=init,
                server_settings=settings, timeout=10, command_timeout=60,
                statement_cache_size=0 if pooled else 100,
            )
    except asyncpg.exceptions.UndefinedObjectError as exc:  # e.g. ?foo=bar in the URL
        raise ConfigError(f"{pg_message(exc)}: remove it from JOBQ_DATABASE_URL") from exc
    except (ValueError, TypeError) as exc:  # the driver could not parse the URL
        raise ConfigError(f"JOBQ_DATABASE_URL is not usable ({redact(url)}): {exc}") from exc
    if check_schema:
        try:
            with translated():
                async with pool.acquire() as conn:
                    await _check_schema(conn)
        except BaseException:
            await pool.close()
            raise
    return pool


async def open_pool(
    url: str, *, wait: bool, min_size: int = 1, max_size: int = 4, app_name: str = "jobq",
    idle_in_tx_s: float | None = None, check_schema: bool = True, role: str | None = None,
    pooled: bool = False, init: Init | None = None, index_paths: bool = False,
) -> asyncpg.Pool:
    """A connected pool (``init``: run on each new session before its first
    use, e.g. the consumer's warm-up). With ``wait``, retry what can heal by itself (the
    database is down or not migrated yet) forever, one line per attempt; a
    mistake that cannot heal (no such database, bad credentials, a missing
    right) raises ConfigError at once, and the service exits 2 with it."""
    backoff = Backoff(0.5, 5.0)
    while True:
        try:
            return await connect_once(
                url, min_size=min_size, max_size=max_size, app_name=app_name,
                idle_in_tx_s=idle_in_tx_s, check_schema=check_schema, role=role, pooled=pooled,
                init=init, index_paths=index_paths,
            )
        except (DatabaseUnavailable, SchemaMissing) as exc:
            if not wait:
                if isinstance(exc, DatabaseUnavailable):
                    raise DatabaseUnavailable(
                        f"cannot reach PostgreSQL at {redact(url)} ({exc.__cause__ or exc}); "
                        "is it running? set JOBQ_DATABASE_URL"
                    ) from exc
                raise
            delay = backoff.next()
            log.warning("database not ready at %s: %s; retrying in %.1fs", redact(url), exc, delay)
            await asyncio.sleep(delay)


@contextlib.asynccontextmanager
async def connection(pool: asyncpg.Pool) -> AsyncIterator[PooledConnection]:
    """A pooled connection that never goes back to the pool broken.

    A backend terminated mid-statement can leave asyncpg's side of the
    connection still looking open, in an error-consuming state; the light
    reset above does not notice (no round trip), and the next borrower got
    ``InternalClientError: ... another operation is in progress`` (issue
    #19). So any error but a plain SQL error (or one that ends the session)
    terminates the connection here, and the pool opens a fresh one.
    """
    with translated():
        async with pool.acquire() as conn:
            try:
                yield conn
            except BaseException as exc:
                if session_broken(exc):
                    try:
                        conn.terminate()
                    except asyncpg.InterfaceError:
                        # asyncpg already closed and released it (the backend
                        # was killed): nothing to end, and the error raised
                        # below is the real cause, not "released back to the pool".
                        pass
                raise


def _server_warning(_conn: object, message: object) -> None:
    text = str(getattr(message, "message", ""))
    if text.startswith("jobq: "):
        logging.getLogger("jobq.client").warning("%s", text.removeprefix("jobq: "))


@contextlib.asynccontextmanager
async def warnings_logged(db: Database) -> AsyncIterator[Database]:
    """Where a statement whose jobq WARNINGs the caller must see runs (an
    idempotency key reused with another payload, schema 0039): on a session
    whose server warnings are logged (logger jobq.client), which asyncpg
    drops unless someone listens. A pool lends one through the guard above."""
    if isinstance(db, asyncpg.Pool):
        async with connection(db) as conn, warnings_logged(conn) as listened:
            yield listened
        return
    db.add_log_listener(_server_warning)
    try:
        yield db
    finally:
        await asyncio.sleep(0)  # the driver schedules the listener's call: let it run
        db.remove_log_listener(_server_warning)


# A statement runs on a pool (a connection borrowed for it, behind the guard
# above) or on a connection the caller holds (a transaction, the worker
# registry's session, a migration): the same four verbs either way, and no
# module but this one calls the driver's.
Database = asyncpg.Pool | asyncpg.Connection | PooledConnection


async def fetch(db: Database, query: str, *args: Any) -> list[asyncpg.Record]:
    if isinstance(db, asyncpg.Pool):
        async with connection(db) as conn:
            return list(await conn.fetch(query, *args))
    return list(await db.fetch(query, *args))  # the holder's errors are the holder's


async def fetchrow(db: Database, query: str, *args: Any) -> asyncpg.Record | None:
    row: asyncpg.Record | None
    if isinstance(db, asyncpg.Pool):
        async with connection(db) as conn:
            row = await conn.fetchrow(query, *args)
            return row
    row = await db.fetchrow(query, *args)
    return row


async def fetchval(db: Database, query: str, *args: Any) -> Any:
    if isinstance(db, asyncpg.Pool):
        async with connection(db) as conn:
            return await conn.fetchval(query, *args)
    return await db.fetchval(query, *args)


async def execute(db: Database, query: str, *args: Any) -> str:
    if isinstance(db, asyncpg.Pool):
        async with connection(db) as conn:
            return str(await conn.execute(query, *args))
    return str(await db.execute(query, *args))


async def ping(db: Database) -> bool:
    """Whether the database answers (health checks)."""
    return bool(await fetchval(db, Q["ping"]))


async def now(db: Database) -> Any:
    """The database clock: the only clock for leases, slots and deadlines."""
    return await fetchval(db, Q["db_now"])


async def prepare(conn: asyncpg.Connection | PooledConnection,
                  query: str) -> asyncpg.prepared_stmt.PreparedStatement[asyncpg.Record]:
    """Parse without running: parameter and result types (routines.py)."""
    return await conn.prepare(query)


@contextlib.asynccontextmanager
async def transaction(pool: asyncpg.Pool) -> AsyncIterator[PooledConnection]:
    async with connection(pool) as conn, conn.transaction():
        yield conn
