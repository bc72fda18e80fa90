"""Messages that carry several ids (#49, docs/reference/wire-format.md) with
real processes: a busy consumer does not sit on a packed message while
another is idle, and a consumer SIGKILLed with a packed message partly
claimed loses nothing and runs nothing twice. Leases are 1 s."""

from __future__ import annotations

import asyncio
import time
import uuid

import aio_pika
import pytest

from harness.helpers import LEASE_S, Procs, SyncDB, completed, publish, set_queue, wait_until
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def _first_runs_by(db: SyncDB, ids: list[uuid.UUID], worker: str) -> int:
    return int(db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1) AND attempt = 1 "
                      "AND worker = $2", ids, worker))


def _finished_runs(db: SyncDB, ids: list[uuid.UUID]) -> int:
    return int(db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1) "
                      "AND outcome = 'returned'", ids))


def test_a_busy_consumer_hands_a_packed_message_on_and_a_kill_loses_nothing(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    procs.reaper()
    a = procs.consumer("--queue", "work", "--concurrency", "2")
    a_id = a.worker_id()
    ids = publish(settings, "work", [{"sleep": 4} for _ in range(10)])  # one message
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 2, 15, "A running 2")
    b = procs.consumer("--queue", "work", "--concurrency", "8")
    b_id = b.worker_id()
    # A holds 8 ids it has no slot for: they go back to the fleet, one
    # message each, and B runs them (A may hold its prefetch of 2 again).
    # Held by A, they would run two at a time on A after its first two: B none.
    wait_until(lambda: _first_runs_by(db, ids, b_id) >= 6, 15, "B running the held ids")
    a.kill()  # with its jobs running: the reaper requeues them, B runs them
    wait_until(lambda: completed(db, ids), 40, "every job completed")
    assert _first_runs_by(db, ids, a_id) + _first_runs_by(db, ids, b_id) == 10
    assert _finished_runs(db, ids) == 10, "a job completed twice, or one not at all"


def test_a_consumer_killed_with_a_packed_message_partly_claimed_loses_nothing(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    procs.reaper()
    a = procs.consumer("--queue", "work", "--concurrency", "3")
    a.worker_id()
    ids = publish(settings, "work", [{"sleep": 2} for _ in range(12)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 3, 15, "A running 3",
               interval=0.01)
    a.kill()  # its message unacked (or handed back already): either way nothing is lost
    killed = time.monotonic()
    b = procs.consumer("--queue", "work", "--concurrency", "12")
    b.worker_id()
    wait_until(lambda: completed(db, ids), 40, "every job completed")
    assert _finished_runs(db, ids) == 12
    print(f"all 12 completed {time.monotonic() - killed:.1f}s after the kill")


def test_any_amqp_client_can_publish_several_ids_in_one_message(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    ids = [db.val("SELECT jobq.enqueue('work', '{}'::jsonb)") for _ in range(3)]

    async def send() -> None:  # as a producer in another language would
        conn = await aio_pika.connect(settings.amqp_url)
        try:
            ch = await conn.channel()
            ex = await ch.get_exchange(settings.namespace)
            body = "\n".join(str(i) for i in ids).encode()
            await ex.publish(aio_pika.Message(body), routing_key="work")
        finally:
            await conn.close()
    procs.consumer("--queue", "work", "--concurrency", "4").worker_id()
    asyncio.run(send())
    wait_until(lambda: completed(db, ids), 20, "the three jobs completed")
    assert _finished_runs(db, ids) == 3
