"""Forward-only, numbered SQL migrations from ``schema/``.

``apply()`` is safe to run twice and from several processes at once: it
holds a session advisory lock for the whole run, applies each file not yet
recorded in ``jobq.schema_migration`` in its own transaction, and records it
with a checksum. A recorded migration whose file changed is reported, not re-run.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg

from jobq import roles
from jobq.db import PooledConnection, connect_once, execute, fetch, fetchval, translated
from jobq.errors import ConfigError
from jobq.ops import routines
from jobq.sql import Q

log = logging.getLogger("jobq.ops.migrate")

# Any constant works; it only has to be the same for every jobq process.
_LOCK_KEY = 0x6A6F6271  # "jobq"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def _schema_dir() -> Path:
    packaged = resources.files("jobq").joinpath("schema")
    if packaged.is_dir():
        return Path(str(packaged))
    # Editable install / source checkout: <repo>/services/jobq -> <repo>/schema
    here = Path(__file__).resolve().parents[3] / "schema"  # <repo>/services/jobq/ops/
    if here.is_dir():
        return here
    raise ConfigError("jobq's schema/ migrations are missing from this installation")


def load() -> list[Migration]:
    found = []
    for path in sorted(_schema_dir().iterdir()):
        m = _FILE.match(path.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError(f"duplicate migration numbers in {_schema_dir()}")
    return found


GROUP_ROLES = roles.names()  # the default install's (roles.py)


async def ensure_roles(conn: asyncpg.Connection | PooledConnection,
                       prefix: str = roles.DEFAULT) -> list[str]:
    """Create the install's missing group roles (NOLOGIN); returns the roles
    created. Roles are cluster-wide: two migrations of different databases
    may race here."""
    created = []
    for role in roles.names(prefix):
        if await fetchval(conn, Q["role_exists"], role):
            continue
        try:
            await execute(conn, await fetchval(conn, Q["role_create_statement"], role))
            created.append(role)
        except (asyncpg.exceptions.DuplicateObjectError, asyncpg.exceptions.UniqueViolationError):
            pass
        except asyncpg.exceptions.InsufficientPrivilegeError as exc:
            user = await fetchval(conn, Q["current_login"])
            raise ConfigError(
                f"role {role} does not exist and role {user} may not create roles: run "
                f"`jobq migrate` once as a role with CREATEROLE, or CREATE ROLE {role} NOLOGIN"
            ) from exc
    return created


async def join_owner(conn: asyncpg.Connection | PooledConnection,
                     prefix: str = roles.DEFAULT) -> None:
    """Make the user running migrate a member of the install's owner role (once)."""
    if not await fetchval(conn, roles.rename(Q["owner_joined"], prefix)):
        user = await fetchval(conn, Q["current_login"])
        owner = roles.name("owner", prefix)
        try:
            await execute(conn, roles.rename(Q["owner_join"], prefix))
        except asyncpg.exceptions.InsufficientPrivilegeError as exc:
            raise ConfigError(f"role {user} runs `jobq migrate` but is not a member of "
                              f"{owner}, which owns the schema: GRANT {owner} TO {user}"
                              ) from exc


async def _as_owner(conn: asyncpg.Connection | PooledConnection,
                    prefix: str = roles.DEFAULT) -> None:
    """Objects are created as the owner role once it owns the schema (0006),
    so they get its default privileges; before that, as the user running."""
    if await fetchval(conn, Q["schema_owner"]) == roles.name("owner", prefix):
        await execute(conn, roles.rename(Q["as_owner"], prefix))


async def check_install(conn: asyncpg.Connection | PooledConnection, prefix: str) -> None:
    """Refuse to migrate an install made with another role prefix: its
    objects would be granted to roles it does not use."""
    theirs = roles.prefix_of(await fetchval(conn, Q["schema_owner"]))
    if theirs is not None and theirs != prefix and await fetchval(conn, Q["migrations_present"]):
        raise ConfigError(f"this database's jobq was installed with the roles {theirs}_*: "
                          f"set JOBQ_ROLE_PREFIX={theirs} (JOBQ_ROLE_PREFIX is {prefix})")


async def shared_with(conn: asyncpg.Connection | PooledConnection,
                      prefix: str = roles.DEFAULT) -> list[str]:
    """Other databases of the cluster where this install's roles hold rights:
    a login granted one of them reaches those too."""
    return [r["datname"] for r in await fetch(conn, Q["roles_shared_with"],
                                              list(roles.names(prefix)))]


async def create_database(url: str) -> bool:
    """Create the database ``url`` names, if missing, from the server's
    ``postgres`` database; True if it was created."""
    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    if not name or name == "postgres":
        return False
    with translated():
        pool = await connect_once(urlunsplit(parts._replace(path="/postgres")), max_size=1,
                                  app_name="jobq-migrate", check_schema=False)
        try:
            if await fetchval(pool, Q["database_exists"], name):
                return False
            await execute(pool, await fetchval(pool, Q["create_database_statement"], name))
        except asyncpg.exceptions.DuplicateDatabaseError:
            return False  # another migrate made it just now
        except asyncpg.exceptions.InsufficientPrivilegeError as exc:
            raise ConfigError(f"database {name!r} does not exist and this login may not create "
                              "it: create it (createdb) or grant CREATEDB") from exc
        finally:
            await pool.close()
    log.info("created database %s", name)
    return True


async def pending(conn: asyncpg.Connection | PooledConnection) -> list[Migration]:
    """Migrations not recorded yet (all of them on an empty database); warns
    of a recorded one whose file changed (it is not re-run)."""
    if await fetchval(conn, Q["migrations_present"]) is None:
        return load()
    done = {r["version"]: r["checksum"] for r in await fetch(conn, Q["migrations_applied"])}
    for m in load():
        if m.version in done and done[m.version] != m.checksum:
            log.warning("migration %04d_%s changed since it was applied; not re-running it",
                        m.version, m.name)
    return [m for m in load() if m.version not in done]


# A migration under load waits for locks that running services hold. It waits
# at most LOCK_TIMEOUT for each (below PostgreSQL's deadlock_timeout, 1 s by
# default, so a wait never turns into a deadlock that aborts a service's
# statement), then rolls back and tries again: seen once, a migration's
# exclusive lock against a reaper's read (the PostgreSQL log's only deadlock).
LOCK_TIMEOUT = "500ms"
LOCK_TRIES = 120


async def _in_turns(conn: asyncpg.Connection | PooledConnection,
                    body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` in a transaction whose lock waits are short; again until
    it gets its locks (about a minute at most)."""
    for attempt in range(LOCK_TRIES):
        try:
            async with conn.transaction():
                await execute(conn, Q["lock_timeout_local"], LOCK_TIMEOUT)
                await body()
            return
        except asyncpg.exceptions.LockNotAvailableError:
            if attempt == LOCK_TRIES - 1:
                raise ConfigError("jobq migrate could not get its locks for a minute: a "
                                  "long transaction holds jobq's tables; try again") from None
            log.info("migration waits for locks held by running services; trying again")
            await asyncio.sleep(random.uniform(0.05, 0.5))


async def _apply_one(conn: asyncpg.Connection | PooledConnection, migration: Migration,
                     prefix: str) -> None:
    if await fetchval(conn, Q["schema_namespace"]) is None:
        await execute(conn, Q["schema_create"])
    await _as_owner(conn, prefix)
    await execute(conn, Q["migrations_create"])
    # the file's text, schema/NNNN_*.sql, with the install's role names
    await execute(conn, roles.rename(migration.sql, prefix))
    await execute(conn, Q["migration_record"], migration.version, migration.name,
                  migration.checksum)


async def _install_routines(conn: asyncpg.Connection | PooledConnection, version: int,
                            prefix: str) -> None:
    await _as_owner(conn, prefix)
    await routines.install(conn, version, prefix)


async def apply(conn: asyncpg.Connection | PooledConnection,
                prefix: str = roles.DEFAULT) -> list[Migration]:
    """Apply what is missing; return the migrations applied by this call.
    Concurrent runs take turns for the whole run (a session advisory lock):
    one applies everything, the others find nothing to do. An up-to-date
    schema needs no right beyond reading schema_migration. ``prefix``: the
    install's role names (roles.py)."""
    applied: list[Migration] = []
    with translated():
        await check_install(conn, prefix)
        await ensure_roles(conn, prefix)
        await execute(conn, Q["migrate_lock"], _LOCK_KEY)
        try:
            todo = await pending(conn)
            version = max(m.version for m in load())
            if todo or await routines.stale(conn, version, prefix):
                await join_owner(conn, prefix)
            for migration in todo:
                await _in_turns(conn, functools.partial(_apply_one, conn, migration, prefix))
                applied.append(migration)
                log.info("applied migration %04d_%s", migration.version, migration.name)
            if await routines.stale(conn, version, prefix):
                await _in_turns(conn, functools.partial(_install_routines, conn, version,
                                                        prefix))
        finally:
            await execute(conn, Q["migrate_unlock"], _LOCK_KEY)
    return applied
