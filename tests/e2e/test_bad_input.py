"""One bad input never stops work for everyone (I6, issue #13): a queue the
broker refuses, a queue setting that makes claims fail, a payload that is
valid JSON but cannot be decoded. Each costs only its own job."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aio_pika
import pytest

from harness.helpers import (
    Procs,
    SyncDB,
    job,
    lost_and_duplicates,
    publish,
    run_cli,
    set_queue,
    wait_until,
)
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def sql_enqueue(db: SyncDB, queue: str, payload: str, n: int = 1) -> list[Any]:
    return [db.val("SELECT jobq.enqueue($1, $2::jsonb)", queue, payload) for _ in range(n)]


def test_a_queue_the_broker_refuses_holds_up_only_its_own_jobs(db: SyncDB, procs: Procs,
                                                               settings: Settings,
                                                               amqp_url: str) -> None:
    async def squat() -> None:  # the name is taken on the broker by a different queue
        conn = await aio_pika.connect(amqp_url)
        ch = await conn.channel()
        await ch.declare_queue(f"{settings.namespace}.blocked", durable=True,
                               arguments={"x-max-length": 1})
        await conn.close()

    asyncio.run(squat())
    blocked = sql_enqueue(db, "blocked", "{}", 10)  # more than a relay batch
    work = sql_enqueue(db, "work", "{}", 20)
    procs.reaper(JOBQ_REAPER__BATCH_SIZE="5")
    procs.consumer()
    wait_until(lambda: lost_and_duplicates(db, work)[0] == 0, 20, "the other queue's jobs")
    assert all(job(db, j)["published_at"] is None for j in blocked)


def test_a_queue_named_dead_is_refused_with_one_line(db: SyncDB, env: dict[str, str],
                                                     settings: Settings) -> None:
    out = run_cli(env, "publish", "dead", "{}")
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "reserved" in out.stderr
    with pytest.raises(Exception, match="reserved"):
        db.val("SELECT jobq.enqueue('dead')")
    with pytest.raises(Exception, match="reserved"):
        publish(settings, "dead", [{}])


def test_a_claim_that_fails_on_its_job_fails_that_job_only(db: SyncDB, procs: Procs,
                                                           settings: Settings) -> None:
    # A setting that makes every claim of its queue fail (possible before
    # schema 0003 bounded them; here forced past the constraint).
    set_queue(db, "other", lease_s=30)
    db.execute("ALTER TABLE jobq.queue DROP CONSTRAINT IF EXISTS queue_lease_s_range")
    db.execute("UPDATE jobq.queue SET lease_s = 'NaN' WHERE name = 'other'")
    procs.reaper()
    procs.consumer("--concurrency", "8").worker_id()
    (bad,) = publish(settings, "other", [{}])
    good = publish(settings, "work", [{} for _ in range(300)])
    wait_until(lambda: lost_and_duplicates(db, good)[0] == 0, 30, "every other job")
    wait_until(lambda: job(db, bad)["status"] == "failed", 10, "the unclaimable job failed")
    assert "cannot be claimed" in job(db, bad)["last_error"]


@pytest.mark.parametrize("payload", ["[" * 2000 + "]" * 2000, '{"n": ' + "9" * 5000 + "}"],
                         ids=["nested-2000-deep", "5000-digit-number"])
def test_a_payload_that_cannot_be_decoded_fails_at_once(db: SyncDB, procs: Procs,
                                                        settings: Settings, payload: Any) -> None:
    procs.reaper()
    procs.consumer().worker_id()
    (bad,) = sql_enqueue(db, "work", payload)
    (ok,) = sql_enqueue(db, "work", "{}")
    wait_until(lambda: job(db, bad)["status"] == "failed", 15, "the hostile job failed")
    row = job(db, bad)
    assert (row["attempts"], row["stalls"], row["suspect_stalls"]) == (1, 0, 0)
    assert "payload cannot be decoded" in row["last_error"]
    wait_until(lambda: job(db, ok)["status"] == "completed", 10, "the next job")


def test_a_claim_error_that_is_not_the_jobs_fault_fails_no_job(db: SyncDB, procs: Procs,
                                                               settings: Settings) -> None:
    """A schema broken under a running consumer (here: a renamed column; in
    life, a missing grant or a half-applied migration) must not fail every
    job as unclaimable: the consumer gives the messages back and exits 2."""
    procs.reaper()
    c = procs.consumer()
    c.worker_id()
    db.execute("ALTER TABLE jobq.job RENAME COLUMN isolated TO isolated_gone")
    ids = publish(settings, "work", [{} for _ in range(5)])
    assert c.wait(20) == 2
    assert "claims fail with an error that retrying cannot heal" in c.log()
    assert [job(db, j)["status"] for j in ids] == ["queued"] * 5
    db.execute("ALTER TABLE jobq.job RENAME COLUMN isolated_gone TO isolated")
    procs.consumer()
    wait_until(lambda: lost_and_duplicates(db, ids)[0] == 0, 20, "all run once fixed")


@pytest.fixture
def amqp_user_without_configure(amqp_url: str) -> Iterator[str]:
    """A RabbitMQ user that may read and write but not declare (configure)."""
    import shutil
    import subprocess
    import uuid
    from urllib.parse import urlsplit

    if not shutil.which("rabbitmqctl") or urlsplit(amqp_url).hostname not in (
            "127.0.0.1", "localhost"):
        pytest.skip("needs the local RabbitMQ node's rabbitmqctl to create a user")
    name, password = f"jobq_noconf_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex

    def ctl(*args: str) -> None:
        subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)

    ctl("add_user", name, password)
    ctl("set_permissions", "-p", "/", name, "", ".*", ".*")
    parts = urlsplit(amqp_url)
    yield parts._replace(netloc=f"{name}:{password}@{parts.hostname}:{parts.port or 5672}"
                         ).geturl()
    ctl("delete_user", name)


def test_a_user_without_configure_permission_runs_where_the_topology_exists(
        db: SyncDB, procs: Procs, settings: Settings, amqp_user_without_configure: Any) -> None:
    procs.reaper()  # as the test's administrator: declares the exchange
    (first,) = publish(settings, "work", [{}])  # declares the job queue
    wait_until(lambda: job(db, first)["published_at"] is not None, 10, "published")
    c = procs.consumer("--queue", "work", JOBQ_AMQP_URL=amqp_user_without_configure)
    c.worker_id()
    wait_until(lambda: job(db, first)["status"] == "completed", 15, "consumed by that user")
    assert "Traceback" not in c.log()


def test_a_user_without_configure_permission_and_no_topology_gets_one_line(
        procs: Procs, settings: Settings, amqp_user_without_configure: Any) -> None:
    c = procs.consumer(JOBQ_AMQP_URL=amqp_user_without_configure,
                       JOBQ_NAMESPACE=f"{settings.namespace}x")
    assert c.wait(30) == 2
    assert "may not declare jobq's exchange" in c.log() and "Traceback" not in c.log()


def test_junk_messages_are_dead_lettered_with_rate_limited_warnings(db: SyncDB, procs: Procs,
                                                                    settings: Settings,
                                                                     amqp_url: str) -> None:
    c = procs.consumer()
    c.worker_id()

    async def junk() -> None:
        conn = await aio_pika.connect(amqp_url)
        ch = await conn.channel()
        ex = await ch.get_exchange(settings.namespace)
        for i in range(200):
            await ex.publish(aio_pika.Message(b"x" * (i * 50)), routing_key="work")
        await conn.close()

    asyncio.run(junk())
    (jid,) = publish(settings, "work", [{}])
    wait_until(lambda: job(db, jid)["status"] == "completed", 20, "a valid job after junk")
    assert 1 <= c.log().count("malformed message") <= 10  # not one line per junk message
    assert c.alive()
