"""PgBouncer in transaction pooling mode between the services and PostgreSQL
(issue #15). With JOBQ_DATABASE_POOLED=true (no kept prepared statements, no
settings at login) and JOBQ_DIRECT_DATABASE_URL for what needs a session
(the registry lock and renewals, LISTEN, migrate), the core flow and a
SIGKILL recovery pass through it; without the flag, the service says what
to set and exits instead of retrying forever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, runs, set_queue, wait_until
from harness.pgbouncer import PgBouncer
from jobq.client.producer import Client
from jobq.newjob import NewJob

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def bouncer(pg_admin_url: str) -> Iterator[PgBouncer]:
    b = PgBouncer(pg_admin_url)
    b.start()
    yield b
    b.close()


@pytest.fixture
def pooled(bouncer: PgBouncer, db_url: str, settings: Any) -> dict[str, Any]:
    url = bouncer.url(db_url)
    env = {"JOBQ_DATABASE_URL": url, "JOBQ_DATABASE_POOLED": "true",
           "JOBQ_DIRECT_DATABASE_URL": db_url}
    return {"env": env, "settings": settings.model_copy(update={
        "database_url": url, "database_pooled": True, "direct_database_url": db_url})}


def publish(settings: Any, payloads: list[Any]) -> list[Any]:
    async def go() -> list[Any]:
        async with Client(settings) as c:
            ids = await asyncio.gather(*(c.publish("work", p) for p in payloads[:50]))
            return [*ids, *await c.publish_many([NewJob("work", p) for p in payloads[50:]])]

    return asyncio.run(go())


def test_core_flow_and_sigkill_recovery_through_pgbouncer(db: SyncDB, procs: Procs,
                                                          pooled: dict[str, Any],
                                                          bouncer: PgBouncer, db_url: str) -> None:
    set_queue(db, "work", lease_s=2.0)
    consumer = procs.consumer("--concurrency", "8", **pooled["env"])
    procs.reaper(environ=pooled["env"])
    procs.reaper(environ=pooled["env"])
    consumer.worker_id()
    ids = publish(pooled["settings"], [{"sleep": 0.01} for _ in range(200)])
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
               == 200, 30, "200 jobs through PgBouncer")
    # The pooled sessions really go through PgBouncer: the consumer's pool is
    # among its clients. (Not pg_stat_activity: a server session carries the
    # application_name of whichever client used it last, often a reaper.)
    assert "jobq-consumer" in {c.get("application_name") for c in bouncer.clients()}
    assert f"{db_url.rsplit('/', 1)[1]}/postgres@" in bouncer.log()

    slow = publish(pooled["settings"], [{"sleep": 4} for _ in range(8)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)", slow)
               == 8, 10, "8 slow jobs running (their handlers started)")
    # The replacement is up before the kill, so the window measured below is the
    # recovery (registry session gone, lease lapsed, republish, claim), not a
    # Python process starting on a loaded machine (5.43 s once in CI).
    procs.consumer("--concurrency", "8", **pooled["env"]).worker_id()
    killed_at = db.val("SELECT now()")
    consumer.kill()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) "
                              "AND status = 'completed'", slow) == 8, 30, "the 8 re-ran")
    reruns = [runs(db, j) for j in slow]
    assert all(len(r) == 2 for r in reruns), "each killed job ran once more, no more"
    back = max((r[1]["started_at"] - killed_at).total_seconds() for r in reruns)
    print(f"PgBouncer: 200 jobs, then 8 of a SIGKILLed consumer back in {back:.2f} s")
    assert back < 2.0 + 3
    assert db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1)", ids + slow) == 208
    logs = "".join(p.log() for p in procs.procs)
    assert "Traceback" not in logs and "prepared statement" not in logs


def test_without_the_pooled_setting_the_service_says_what_to_set(procs: Procs, bouncer: PgBouncer,
                                                                 db_url: str) -> None:
    consumer = procs.consumer(JOBQ_DATABASE_URL=bouncer.url(db_url))
    consumer.wait_log(r"set JOBQ_DATABASE_POOLED=true", timeout=15)
    deadline = time.monotonic() + 10
    while consumer.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not consumer.alive() and consumer.popen.returncode == 2


def test_a_result_is_awaited_through_pgbouncer(procs: Procs, pooled: dict[str, Any]) -> None:
    """client.result() LISTENs on a direct session (JOBQ_DIRECT_DATABASE_URL)."""
    procs.consumer(environ=pooled["env"]).worker_id()

    async def go() -> Any:
        async with Client(pooled["settings"]) as c:
            jid = await c.publish("results", {"return": {"ok": 42}, "hold": 0.5})
            return await c.result(jid, timeout=15)

    assert asyncio.run(go()) == {"ok": 42}
