"""Scratch databases and AMQP namespaces for benchmarks, like the tests'
fixtures: created for one run, dropped afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import asyncpg

from harness.helpers import Procs, SyncDB
from harness.scratch import TEST_RUN_DDL
from harness.scratch import admin as _admin
from harness.scratch import delete_namespace as _delete_namespace
from harness.scratch import with_db as _with_db
from jobq.ops import migrate
from jobq.settings import Settings

ADMIN_URL = os.environ.get("JOBQ_TEST_DATABASE_URL",
                           "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("JOBQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


@contextlib.contextmanager
def scratch(queues: tuple[str, ...] = ("work",),
            migrate_with: str | None = None) -> Iterator[tuple[str, str, str]]:
    """(database url, amqp url, namespace) of a fresh migrated database.
    ``migrate_with``: the services/ folder of another build, whose own
    ``jobq migrate`` (its schema, its statements) makes the database: an A/B
    of SQL changes needs each build on its own schema."""
    name = f"jobq_bench_{uuid.uuid4().hex[:8]}"
    namespace = f"bench{uuid.uuid4().hex[:8]}"

    def other_migrate() -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
        subprocess.run([sys.executable, "-m", "jobq", "migrate"], check=True,
                       env={**env, "PYTHONPATH": str(migrate_with),
                            "JOBQ_DATABASE_URL": _with_db(ADMIN_URL, name)},
                       stdout=subprocess.DEVNULL)

    async def setup() -> None:
        await _admin(ADMIN_URL, f"CREATE DATABASE {name}")
        if migrate_with is not None:
            await asyncio.to_thread(other_migrate)
        conn = await asyncpg.connect(_with_db(ADMIN_URL, name))
        if migrate_with is None:
            await migrate.apply(conn)
        await conn.execute(TEST_RUN_DDL)
        await conn.close()

    async def declared() -> list[str]:
        # Every queue a service declared has its row (consumers register the
        # app's queues), so none is left behind on the shared broker, whose
        # file handles a few hundred stray quorum queues use up.
        try:
            conn = await asyncpg.connect(_with_db(ADMIN_URL, name))
        except Exception:
            return []
        try:
            return [r["name"] for r in await conn.fetch("SELECT name FROM jobq.queue")]
        except Exception:
            return []
        finally:
            await conn.close()

    try:
        asyncio.run(setup())
    except BaseException:  # a failed migration must not leave the database behind
        asyncio.run(_admin(ADMIN_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        raise
    try:
        yield _with_db(ADMIN_URL, name), AMQP_URL, namespace
    finally:
        deadlocks = asyncio.run(_deadlocks(name))
        print(f"[{name}] pg_stat_database.deadlocks during the run: {deadlocks} (target 0)",
              flush=True)
        every = sorted({*queues, *asyncio.run(declared())})
        asyncio.run(_delete_namespace(AMQP_URL, namespace, every))
        asyncio.run(_admin(ADMIN_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def _deadlocks(name: str) -> int | str:
    """pg_stat_database.deadlocks of a scratch database (issue #36)."""
    try:
        conn = await asyncpg.connect(ADMIN_URL)
        try:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(await conn.fetchval(
                "SELECT coalesce(deadlocks, 0) FROM pg_stat_database WHERE datname = $1",
                name) or 0)
        finally:
            await conn.close()
    except Exception as exc:  # a report, never a reason to fail the benchmark
        return f"unknown ({type(exc).__name__})"


def service_env(db_url: str, amqp_url: str, namespace: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    env.update({
        "JOBQ_DATABASE_URL": db_url, "JOBQ_AMQP_URL": amqp_url, "JOBQ_NAMESPACE": namespace,
        "HARNESS_DATABASE_URL": db_url,  # --pool process handlers get no JOBQ_*_URL
        "JOBQ_LOG_LEVEL": "INFO",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    }, **extra)
    return env


@dataclass
class World:
    """A scratch database and namespace with what a benchmark drives them by."""

    db_url: str
    amqp_url: str
    settings: Settings
    db: SyncDB
    procs: Procs


@contextlib.contextmanager
def world(queues: tuple[str, ...], name: str, migrate_with: str | None = None,
          **env: str) -> Iterator[World]:
    """scratch() plus settings, a database handle and a process group whose
    services get ``env`` (e.g. JOBQ_LOG_LEVEL); everything closed afterwards."""
    with scratch(queues, migrate_with) as (db_url, amqp_url, ns):
        settings = Settings(database_url=db_url, amqp_url=amqp_url, namespace=ns)
        db = SyncDB(db_url)
        procs = Procs(service_env(db_url, amqp_url, ns, **env),
                      Path(tempfile.mkdtemp(prefix=f"jobq-{name}-")))
        try:
            yield World(db_url, amqp_url, settings, db, procs)
        finally:
            procs.close()
            db.close()
