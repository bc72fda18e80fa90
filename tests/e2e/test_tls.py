"""TLS with verification (issue #14), on private servers the fixture starts:
a PostgreSQL cluster that refuses plaintext (hostssl only) and a RabbitMQ
node with a TLS listener and no plaintext one, both with certificates from a
throwaway CA. The core flow and a SIGKILL recovery run through them; a wrong
CA or a host name the certificate does not name fails closed, one line."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from harness.helpers import Procs, SyncDB, run_cli, wait_until
from harness.scratch import TEST_RUN_DDL
from harness.tls import CA, TlsPostgres, TlsRabbit
from jobq.ops import migrate

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("tls")
    ca, wrong = CA.make(base / "ca"), CA.make(base / "wrong", "some other CA")
    pg, rabbit = TlsPostgres(ca), TlsRabbit(ca)
    try:
        pg.start()
        rabbit.start()

        async def prepare() -> None:
            conn = await asyncpg.connect(pg.url(ca=ca.cert))
            try:
                await migrate.apply(conn)
                await conn.execute(TEST_RUN_DDL)
            finally:
                await conn.close()

        asyncio.run(prepare())
        yield {"ca": ca, "wrong": wrong, "pg": pg, "rabbit": rabbit}
    finally:
        rabbit.stop()
        pg.stop()


@pytest.fixture
def tls_env(tls: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    ca = tls["ca"].cert
    e = {k: v for k, v in env.items() if not k.startswith("JOBQ_TEST_LOGIN")
         and not k.startswith("JOBQ_TEST_BROKER")}
    e.update(JOBQ_DATABASE_URL=tls["pg"].url(ca=ca), JOBQ_AMQP_URL=tls["rabbit"].url(ca=ca))
    return e


def test_core_flow_and_a_sigkill_recovery_over_verified_tls(
        tls: dict[str, Any], tls_env: dict[str, str], tmp_path: Path) -> None:
    db = SyncDB(tls_env["JOBQ_DATABASE_URL"])
    procs = Procs(tls_env, tmp_path)
    try:
        assert db.val("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
        db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('work', 2) "
                   "ON CONFLICT (name) DO UPDATE SET lease_s = 2")
        db.execute("DELETE FROM jobq.job")
        a = procs.consumer("--queue", "work")
        a.worker_id()
        procs.reaper()
        ids = [run_cli(tls_env, "publish", "work", '{"sleep_first": 30}').stdout.strip()
               for _ in range(3)]
        assert all(len(i) == 36 for i in ids), ids
        wait_until(lambda: db.val("SELECT count(DISTINCT job_id) FROM test_run") == 3, 20,
                   "three jobs running in A")
        # Every service's sessions are encrypted.
        assert db.val("SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a "
                      "USING (pid) WHERE a.application_name LIKE 'jobq%'") is True
        a.signal(signal.SIGKILL)
        b = procs.consumer("--queue", "work")
        b.worker_id()
        wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
                   == 3, 30, "B to complete all three")
        assert db.val("SELECT count(*) FROM test_run") == 6  # each ran twice: A, then B
        quick = run_cli(tls_env, "publish", "work", "{}").stdout.strip()
        wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1::uuid", quick)
                   == "completed", 20, "a new job through TLS")
    finally:
        procs.close()
        db.close()


@pytest.mark.parametrize("mistake", ["wrong CA", "wrong host name"])
def test_a_wrong_ca_or_host_name_fails_closed_with_one_line(
        tls: dict[str, Any], tls_env: dict[str, str], mistake: str) -> None:
    ca, wrong = tls["ca"].cert, tls["wrong"].cert
    kw = {"ca": wrong} if mistake == "wrong CA" else {"ca": ca, "host": "127.0.0.1"}
    bad_db = {**tls_env, "JOBQ_DATABASE_URL": tls["pg"].url(**kw)}
    bad_broker = {**tls_env, "JOBQ_AMQP_URL": tls["rabbit"].url(**kw)}
    for e, args, what in ((bad_db, ["stats"], "PostgreSQL"),
                          (bad_db, ["reap"], "PostgreSQL"),
                          (bad_broker, ["reap"], "RabbitMQ"),
                          (bad_broker, ["consume", "harness.apps:app", "--queue", "work"],
                           "RabbitMQ")):
        out = run_cli(e, *args, timeout=60)
        assert out.returncode == 2, (mistake, args, out.stderr[-1500:])
        assert "Traceback" not in out.stderr
        (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("jobq: error:")]
        assert f"{what}'s TLS certificate" in line and "was refused" in line, line
        assert "guest:guest" not in out.stderr + out.stdout
