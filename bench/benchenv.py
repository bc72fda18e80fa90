"""Scratch databases and AMQP namespaces for benchmarks, like the tests'
fixtures: created for one run, dropped afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import asyncpg
from tests.conftest import TEST_RUN_DDL, _admin, _delete_namespace, _with_db

from jobq import migrate

ADMIN_URL = os.environ.get("JOBQ_TEST_DATABASE_URL",
                           "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("JOBQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


@contextlib.contextmanager
def scratch(queues: tuple[str, ...] = ("work",)) -> Iterator[tuple[str, str, str]]:
    """(database url, amqp url, namespace) of a fresh migrated database."""
    name = f"jobq_bench_{uuid.uuid4().hex[:8]}"
    namespace = f"bench{uuid.uuid4().hex[:8]}"

    async def setup() -> None:
        await _admin(ADMIN_URL, f"CREATE DATABASE {name}")
        conn = await asyncpg.connect(_with_db(ADMIN_URL, name))
        await migrate.apply(conn)
        await conn.execute(TEST_RUN_DDL)
        await conn.close()

    asyncio.run(setup())
    try:
        yield _with_db(ADMIN_URL, name), AMQP_URL, namespace
    finally:
        asyncio.run(_delete_namespace(AMQP_URL, namespace, list(queues)))
        asyncio.run(_admin(ADMIN_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def service_env(db_url: str, amqp_url: str, namespace: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    env.update({
        "JOBQ_DATABASE_URL": db_url, "JOBQ_AMQP_URL": amqp_url, "JOBQ_NAMESPACE": namespace,
        "JOBQ_LOG_LEVEL": "INFO",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    }, **extra)
    return env
