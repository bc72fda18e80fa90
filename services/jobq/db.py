"""PostgreSQL access: pools, start-up retries, and the one place where asyncpg
errors are translated into jobq's error tree.

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
import re
import ssl
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg

from jobq.backoff import Backoff
from jobq.endpoints import redact
from jobq.errors import (
    BadInput,
    ConfigError,
    DatabaseUnavailable,
    InvalidPayload,
    InvalidQueue,
    JobqError,
    SchemaMissing,
    UnavailableError,
)

log = logging.getLogger("jobq.db")

# Errors that mean "the database is not reachable right now", not "your
# statement is wrong": connection refused/reset, server restarting, admin
# shutdown, too many connections, a closed connection. Every asyncpg error
# class is one of: transient (here), configuration (translated() below),
# the caller's input (translated() below), or a bug in jobq (anything else).
TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # asyncpg's own protocol state machine gave up on a connection whose
    # backend died mid-statement ("cannot switch to state 12; another
    # operation (2) is in progress"): the connection is dead, the statement
    # may run again on another one. connection() below terminates it.
    asyncpg.InternalClientError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InsufficientResourcesError,
    # A conflict the server resolved by aborting us: the statement is safe to
    # run again (every jobq write is fenced or idempotent).
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.LockNotAvailableError,
)

# SQLSTATE classes after which a session is gone or going: 08 connection
# exception, 57 operator intervention (admin shutdown, terminated backend).
_SESSION_ENDING = ("08", "57")


def session_broken(exc: BaseException) -> bool:
    """After this error, is the connection unfit for another statement? Yes
    unless it was a plain SQL error on a session that goes on (a conflict, a
    constraint, a cancel): a dropped or terminated session, a driver-internal
    error, a timeout abandoned mid-statement, a bug."""
    cause = exc.__cause__ if isinstance(exc, JobqError) and exc.__cause__ else exc
    if isinstance(cause, asyncpg.PostgresError):
        state = cause.sqlstate or ""
        return state[:2] in _SESSION_ENDING and state != "57014"  # 57014: just a cancel
    return True


def is_data_error(exc: BaseException) -> bool:
    """A statement failed on the values it worked with (SQLSTATE class 22:
    out of range, invalid text, ...): the row's data, not the database."""
    cause = exc.__cause__ if isinstance(exc, JobqError) else exc
    while cause is not None and not isinstance(cause, asyncpg.PostgresError):
        cause = cause.__cause__
    return isinstance(cause, asyncpg.PostgresError) and (cause.sqlstate or "").startswith("22")


def is_transient(exc: BaseException) -> bool:
    """Will running the same (fenced, idempotent) statement again heal it?"""
    if isinstance(exc, UnavailableError):  # DatabaseUnavailable, BrokerUnavailable
        return True
    cause = exc.__cause__ if isinstance(exc, JobqError) else exc
    return isinstance(cause, TRANSIENT)


# What pool.acquire() hands out (a proxy with a Connection's methods); generic
# only in the type stubs.
if TYPE_CHECKING:
    PooledConnection = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]
else:
    PooledConnection = asyncpg.pool.PoolConnectionProxy

# Plan every statement for its actual arguments. A generic plan cached while
# jobq.job was empty (a fresh deployment, a test) keeps sequential scans long
# after the table grew: measured 3x slower end to end at 20 k rows.
# No JIT: every jobq statement is short; compiling one cost more than running
# it (the dashboard's queue counts: 350 ms of JIT for 30 ms of work on a
# 1 M-row table, bench/dashboard.py).
SESSION_SETTINGS = {"plan_cache_mode": "force_custom_plan", "jit": "off"}


@contextlib.contextmanager
def translated() -> Any:
    """Translate driver errors into the jobq tree; let everything else pass."""
    try:
        yield
    except asyncpg.exceptions.InvalidCatalogNameError as exc:
        raise ConfigError(f"{exc}: create the database or fix JOBQ_DATABASE_URL") from exc
    except (asyncpg.exceptions.InvalidAuthorizationSpecificationError,
            asyncpg.exceptions.InvalidPasswordError) as exc:
        raise ConfigError(f"{exc}: check the user and password in JOBQ_DATABASE_URL") from exc
    except asyncpg.exceptions.ClientConfigurationError as exc:  # before TRANSIENT: a subclass
        raise ConfigError(f"JOBQ_DATABASE_URL: {exc}") from exc
    except asyncpg.exceptions.InsufficientPrivilegeError as exc:
        raise ConfigError(missing_right(pg_message(exc))) from exc
    except asyncpg.exceptions.UndefinedTableError as exc:
        raise ConfigError(
            f"{pg_message(exc)}: the jobq schema is missing; run `jobq migrate`") from exc
    except asyncpg.exceptions.UndefinedFunctionError as exc:
        raise ConfigError(
            f"{pg_message(exc)}: the jobq schema is missing or old; run `jobq migrate`") from exc
    except asyncpg.exceptions.InvalidParameterValueError as exc:
        raise InvalidQueue(pg_message(exc)) from exc
    except asyncpg.exceptions.StringDataRightTruncationError as exc:
        raise InvalidPayload(pg_message(exc)) from exc
    except asyncpg.exceptions.UntranslatableCharacterError as exc:  # \u0000 in jsonb
        raise InvalidPayload(f"{pg_message(exc)}: PostgreSQL cannot store a NUL character "
                             "(\\u0000) in a payload") from exc
    except (asyncpg.exceptions.CheckViolationError,
            asyncpg.exceptions.UniqueViolationError,  # an idempotency key of another login
            asyncpg.exceptions.ForeignKeyViolationError) as exc:  # after => an unknown job
        raise BadInput(pg_message(exc)) from exc
    except asyncpg.exceptions.ProtocolViolationError as exc:  # before TRANSIENT: a subclass
        if "unsupported startup parameter" not in str(exc):
            raise DatabaseUnavailable(f"database unavailable: {exc}") from exc
        raise ConfigError(f"{exc}: JOBQ_DATABASE_URL looks like a connection pooler "
                          "(PgBouncer); set JOBQ_DATABASE_POOLED=true") from exc
    except ssl.SSLCertVerificationError as exc:  # before TRANSIENT: an OSError
        raise ConfigError(
            f"PostgreSQL's TLS certificate was refused ({certificate_refused(exc)}): check "
            "sslrootcert and the host name in JOBQ_DATABASE_URL") from exc
    except TRANSIENT as exc:
        raise DatabaseUnavailable(f"database unavailable: {type(exc).__name__}: {exc}") from exc


def certificate_refused(exc: BaseException) -> str | None:
    """The reason, if ``exc`` is a TLS peer verification failure (a wrong
    CA, an expired certificate, a host name the certificate does not name):
    that cannot heal by retrying, so callers fail closed at once."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, ssl.SSLCertVerificationError):
            return str(e.verify_message or e)
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return text.split("certificate verify failed:", 1)[-1].split("(_ssl.c")[0].strip()
    return None


_login: list[str] = []  # the user this process logs in as (set by connect_once)


def missing_right(message: str) -> str:
    """One line naming the right, the role that lacks it and the role to grant."""
    from jobq.sql import GRANTS

    fn = re.search(r"function (?:jobq\.)?(\w+)", message)
    if fn and fn.group(1).startswith("q_") and fn.group(1)[2:] in GRANTS:
        group = " or ".join(GRANTS[fn.group(1)[2:]])
    elif fn and fn.group(1) == "enqueue":
        group = "jobq_producer"
    else:
        group = "the jobq_* role of this service (README: Deploying with least privilege)"
    who = f"role {_login[-1]}" if _login else "the role in JOBQ_DATABASE_URL"
    return f"{message}: {who} lacks a right jobq needs; grant it {group}"


def pg_message(exc: asyncpg.PostgresError) -> str:
    msg = str(getattr(exc, "message", None) or exc).removeprefix("jobq: ")
    hint = getattr(exc, "hint", None)
    return f"{msg} ({hint})".replace("\n", " ") if hint else msg.replace("\n", " ")


async def _light_reset(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default reset query (one round trip per
    statement): jobq's pooled sessions set no session state, hold no
    advisory locks (the worker registry has its own connection) and never
    LISTEN. Only a transaction left open by mistake is rolled back."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def _check_schema(conn: asyncpg.Connection | PooledConnection) -> None:
    if await conn.fetchval("SELECT to_regclass('jobq.job')") is None:
        raise SchemaMissing("the database has no jobq schema yet: run `jobq migrate`")


async def connect_once(
    url: str, *, min_size: int = 1, max_size: int = 4, app_name: str = "jobq",
    idle_in_tx_s: float | None = None, check_schema: bool = True, role: str | None = None,
    pooled: bool = False,
) -> asyncpg.Pool:
    settings = {"application_name": app_name, **SESSION_SETTINGS}
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
                url, min_size=min_size, max_size=max_size, reset=_light_reset,
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
    pooled: bool = False,
) -> asyncpg.Pool:
    """A connected pool. With ``wait``, retry what can heal by itself (the
    database is down or not migrated yet) forever, one line per attempt; a
    mistake that cannot heal (no such database, bad credentials, a missing
    right) raises ConfigError at once, and the service exits 2 with it."""
    backoff = Backoff(0.5, 5.0)
    while True:
        try:
            return await connect_once(
                url, min_size=min_size, max_size=max_size, app_name=app_name,
                idle_in_tx_s=idle_in_tx_s, check_schema=check_schema, role=role, pooled=pooled,
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
                    conn.terminate()
                raise


async def fetch(pool: asyncpg.Pool, query: str, *args: Any) -> list[asyncpg.Record]:
    async with connection(pool) as conn:
        return list(await conn.fetch(query, *args))


async def fetchval(pool: asyncpg.Pool, query: str, *args: Any) -> Any:
    async with connection(pool) as conn:
        return await conn.fetchval(query, *args)


async def execute(pool: asyncpg.Pool, query: str, *args: Any) -> str:
    async with connection(pool) as conn:
        return str(await conn.execute(query, *args))


@contextlib.asynccontextmanager
async def transaction(pool: asyncpg.Pool) -> AsyncIterator[PooledConnection]:
    async with connection(pool) as conn, conn.transaction():
        yield conn
