"""Which asyncpg errors mean what, and their translation into jobq's error
tree: transient (the database is away; a fenced statement may run again),
configuration (one line, exit 2), the caller's input, or a bug (anything
else). ``db.connection()`` and every gateway call use them; nothing else
catches driver errors by type.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import uuid
from typing import Any

import asyncpg

from jobq.errors import (
    BadInput,
    ConfigError,
    DatabaseUnavailable,
    DuplicateJob,
    InvalidPayload,
    InvalidQueue,
    JobqError,
    UnavailableError,
)

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
    except asyncpg.exceptions.UniqueViolationError as exc:
        raise duplicate(exc) from exc
    except (asyncpg.exceptions.CheckViolationError,  # an idempotency key of another login
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


_HOLDER = re.compile(r"^jobq: duplicate: .* held by job ([0-9a-f-]{36})")


def duplicate(exc: asyncpg.exceptions.UniqueViolationError) -> BadInput:
    """on_duplicate 'refuse' (schema 0032): DuplicateJob naming the holder;
    any other unique violation (an idempotency key of another login): BadInput."""
    found = _HOLDER.match(str(exc))
    if found is None:
        return BadInput(pg_message(exc))
    return DuplicateJob(pg_message(exc), uuid.UUID(found.group(1)))


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
