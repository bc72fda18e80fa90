"""Fixtures on real PostgreSQL and RabbitMQ.

Where the services come from, in order:
1. ``JOBQ_TEST_DATABASE_URL`` / ``JOBQ_TEST_AMQP_URL`` when set;
2. the local defaults (127.0.0.1:5432 trust auth, 127.0.0.1:5672 guest) when
   something listens there;
3. otherwise testcontainers starts them (needs a Docker engine).

Isolation: each test gets its own database, cloned from a template migrated
once per run, and its own AMQP namespace (exchange and queue names), which is
deleted afterwards. Runs and tests never see each other's jobs.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

from harness.scratch import (
    TEST_RUN_DDL,
    BrokerLogins,
    Logins,
    admin,
    delete_namespace_of,
    reachable,
    with_db,
)
from jobq.ops import migrate
from jobq.settings import Settings

if TYPE_CHECKING:
    from harness.helpers import Procs, SyncDB

RUN = uuid.uuid4().hex[:8]

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_admin_url(request: pytest.FixtureRequest) -> str:
    url = os.environ.get("JOBQ_TEST_DATABASE_URL")
    if url:
        return url
    if reachable("127.0.0.1", 5432):
        return "postgresql://postgres@127.0.0.1:5432/postgres"
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:16-alpine", driver=None)
    container.start()
    request.addfinalizer(container.stop)
    return str(container.get_connection_url())


@pytest.fixture(scope="session")
def amqp_url(request: pytest.FixtureRequest) -> str:
    url = os.environ.get("JOBQ_TEST_AMQP_URL")
    if url:
        return url
    if reachable("127.0.0.1", 5672):
        return "amqp://guest:guest@127.0.0.1:5672/"
    from testcontainers.rabbitmq import RabbitMqContainer

    container = RabbitMqContainer("rabbitmq:3.13-alpine")
    container.start()
    request.addfinalizer(container.stop)
    host = container.get_container_host_ip()
    port = container.get_exposed_port(5672)
    return f"amqp://guest:guest@{host}:{port}/"


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    name = f"jobq_tpl_{RUN}"

    async def setup() -> None:
        await admin(pg_admin_url, f"CREATE DATABASE {name}")
        conn = await asyncpg.connect(with_db(pg_admin_url, name))
        try:
            await migrate.apply(conn)
            # Test handlers (harness/apps.py) log every start here.
            await conn.execute(TEST_RUN_DDL)
            # ... as the consumers' own role does (harness.apps runs in them).
            await conn.execute("GRANT SELECT, INSERT, UPDATE ON public.test_run TO jobq_consumer;"
                               "GRANT USAGE ON SEQUENCE public.test_run_n_seq TO jobq_consumer;"
                               "GRANT SELECT, INSERT, UPDATE ON public.test_counter "
                               "TO jobq_consumer")
        finally:
            await conn.close()

    asyncio.run(setup())
    yield name
    asyncio.run(admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def logins(pg_admin_url: str, template_db: str) -> Iterator[Logins]:
    """One login role per jobq group role for this run (issue #14)."""
    made = Logins(pg_admin_url, RUN)
    try:
        made.setup()
        yield made
    finally:
        made.drop()


@pytest.fixture(scope="session")
def broker_logins(amqp_url: str) -> Iterator[BrokerLogins | None]:
    """One RabbitMQ user per service, limited to this run's namespaces
    (where the broker is local; otherwise the services share amqp_url)."""
    if not BrokerLogins.available(amqp_url):
        yield None
        return
    made = BrokerLogins(amqp_url, RUN, prefix=f"jqt{RUN}")
    try:
        made.setup()
        yield made
    finally:
        made.drop()


@pytest.fixture
def db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    name = f"jobq_t_{RUN}_{next(_counter)}"
    asyncio.run(admin(pg_admin_url, f"CREATE DATABASE {name} TEMPLATE {template_db}"))
    yield with_db(pg_admin_url, name)
    _record_deadlocks(pg_admin_url, name)
    asyncio.run(admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


# pg_stat_database.deadlocks of every test database, added up for the run's
# summary (issue #36: target 0). Workers of one run share a file named after
# the controlling pytest process.
def _deadlock_file(controller: int) -> Path:
    return Path(tempfile.gettempdir()) / f"jobq-deadlocks-{controller}.txt"


def _record_deadlocks(admin_url: str, name: str) -> None:
    async def read() -> int:
        conn = await asyncpg.connect(admin_url)
        try:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(await conn.fetchval(
                "SELECT coalesce(deadlocks, 0) FROM pg_stat_database WHERE datname = $1", name)
                or 0)
        finally:
            await conn.close()

    try:
        n = asyncio.run(read())
    except Exception:
        return
    controller = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    with _deadlock_file(controller).open("a") as f:
        f.write(f"{name} {n}\n")


# Tests marked heavy hold some 45 server connections each (a fleet of
# consumers and reapers: nemesis 48, limits 46, soak 42 at their peak); two
# of them beside the other workers'
# tests ran the shared PostgreSQL out of its 100 (CI: "too many clients",
# and a rate test starved of its consumers). They take turns on a lock file
# of the run, named after the controlling pytest process as above; the rest
# of the suite still runs beside them.
@pytest.fixture(autouse=True)
def _heavy_tests_take_turns(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("heavy") is None:
        yield
        return
    controller = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    with (Path(tempfile.gettempdir()) / f"jobq-heavy-{controller}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = _deadlock_file(os.getpid())
    if not path.exists():
        return
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    path.unlink()
    total = sum(int(n) for _, n in rows)
    worst = [f"{d}: {n}" for d, n in rows if int(n)]
    terminalreporter.write_line(
        f"jobq: pg_stat_database.deadlocks over {len(rows)} test databases: {total}"
        + (f" ({', '.join(worst[:5])})" if worst else ""))


@pytest.fixture
def namespace(amqp_url: str, db_url: str) -> Iterator[str]:
    ns = f"jqt{RUN}{next(_counter)}"
    yield ns
    asyncio.run(delete_namespace_of(db_url, amqp_url, ns, []))


@pytest.fixture
def settings(db_url: str, amqp_url: str, namespace: str) -> Settings:
    return Settings.model_validate({
        "database_url": db_url, "amqp_url": amqp_url, "namespace": namespace,
        "producer": {"relay_grace_s": 1.0},
        "reaper": {"max_sleep_s": 0.2},
        "consumer": {"shutdown_grace_s": 2.0},
    })


@pytest.fixture
def env(settings: Settings, tmp_path: os.PathLike[str], logins: Logins,
        broker_logins: BrokerLogins | None) -> dict[str, str]:
    """Environment for jobq subprocesses (CLI, consumers, reapers). Each
    command runs as the login of its role (harness.helpers.as_role)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    e = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    e.update({
        "JOBQ_DATABASE_URL": settings.database_url,
        "JOBQ_AMQP_URL": settings.amqp_url,
        "JOBQ_NAMESPACE": settings.namespace,
        "JOBQ_PRODUCER__RELAY_GRACE_S": "1",
        "JOBQ_REAPER__MAX_SLEEP_S": "0.2",
        "JOBQ_CONSUMER__SHUTDOWN_GRACE_S": "2",
        "JOBQ_AMQP_HEARTBEAT_S": "2",
        "PYTHONPATH": root + os.pathsep + e.get("PYTHONPATH", ""),
        "PYTHONUNBUFFERED": "1",
        "JOBQ_TEST_RUNLOG": str(tmp_path),
        "JOBQ_TEST_LOGIN_ADMIN": settings.database_url,
        "HARNESS_DATABASE_URL": settings.database_url,  # handlers' own (harness/apps.py)
        **{f"JOBQ_TEST_LOGIN_{g.upper()}": logins.url(g, settings.database_url)
           for g in Logins.GROUPS},
        "JOBQ_TEST_BROKER_ADMIN": settings.amqp_url,
        **({f"JOBQ_TEST_BROKER_{g.upper()}": broker_logins.url(g) for g in broker_logins.names}
           if broker_logins else {}),
    })
    return e


@pytest.fixture
def db(db_url: str) -> Iterator[SyncDB]:
    from harness.helpers import SyncDB

    handle = SyncDB(db_url)
    yield handle
    handle.close()


@pytest.fixture
def procs(env: dict[str, str], tmp_path: os.PathLike[str]) -> Iterator[Procs]:
    from pathlib import Path

    from harness.helpers import Procs

    factory = Procs(env, Path(tmp_path))
    yield factory
    factory.close()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Any:
    """Record a fault scenario's figures; ``bench/faults.py`` turns them into
    a table (set JOBQ_TEST_FAULT_REPORT=path.jsonl to collect)."""
    import json

    path = os.environ.get("JOBQ_TEST_FAULT_REPORT")

    def record(scenario: str, jobs: int, lost: int, duplicate_runs: int,
               latencies: list[float] | None = None) -> None:
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.name, "scenario": scenario,
                                    "jobs": jobs, "lost": lost,
                                    "duplicate_runs": duplicate_runs,
                                    "latencies": latencies or []}) + "\n")

    return record
