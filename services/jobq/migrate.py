"""Forward-only, numbered SQL migrations from ``schema/``.

``apply()`` is safe to run twice and from several processes at once: it takes
a transaction-level advisory lock, applies each file not yet recorded in
``jobq.schema_migration`` in its own transaction, and records it with a
checksum. A recorded migration whose file changed is reported, not re-run.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from jobq.db import PooledConnection
from jobq.errors import ConfigError

log = logging.getLogger("jobq.migrate")

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
    here = Path(__file__).resolve().parent.parent.parent / "schema"
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


async def apply(conn: asyncpg.Connection | PooledConnection) -> list[Migration]:
    """Apply what is missing; return the migrations applied by this call."""
    applied: list[Migration] = []
    for migration in load():
        async with conn.transaction():
            # Serialises concurrent `jobq migrate` runs; released at commit.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute("CREATE SCHEMA IF NOT EXISTS jobq")
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS jobq.schema_migration (
                       version integer PRIMARY KEY,
                       name text NOT NULL,
                       checksum text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            row = await conn.fetchrow(
                "SELECT checksum FROM jobq.schema_migration WHERE version = $1",
                migration.version,
            )
            if row is not None:
                if row["checksum"] != migration.checksum:
                    log.warning(
                        "migration %04d_%s changed since it was applied; not re-running it",
                        migration.version, migration.name,
                    )
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO jobq.schema_migration (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version, migration.name, migration.checksum,
            )
            applied.append(migration)
            log.info("applied migration %04d_%s", migration.version, migration.name)
    return applied
