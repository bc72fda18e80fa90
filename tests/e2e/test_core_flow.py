"""End to end with real processes: the happy path and the crashes the core
must survive (issue #2). Leases are 1 s so the suite stays fast."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from harness.helpers import (
    LEASE_S,
    SLACK_S,
    Procs,
    SyncDB,
    completed,
    job,
    lost_and_duplicates,
    publish,
    requeue_latency,
    run_cli,
    runs,
    set_queue,
    wait_until,
)
from jobq.amqp.broker import Broker
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def test_happy_path_cli_and_services(db: SyncDB, env: dict[str, str], procs: Procs,
                                     settings: Settings) -> None:
    set_queue(db, "work", lease_s=2)
    reaper = procs.reaper()
    consumer = procs.consumer("--queue", "work", "--concurrency", "4")
    consumer.worker_id()
    out = run_cli(env, "publish", "work", '{"sleep": 0.1}')
    assert out.returncode == 0, out.stderr
    first = out.stdout.strip()
    ids = [first, *map(str, publish(settings, "work", [{"n": i} for i in range(30)]))]
    wait_until(lambda: completed(db, ids), 20, "all jobs completed")
    # Each ran exactly once, returned normally, in our consumer.
    counts = db.fetch("SELECT job_id, count(*) AS n, min(outcome) AS o FROM test_run "
                      "GROUP BY job_id")
    assert len(counts) == 31 and all(r["n"] == 1 and r["o"] == "returned" for r in counts)
    row = job(db, first)
    assert row["attempts"] == 1 and row["stalls"] == 0 and row["worker_id"] == consumer.worker_id()
    assert reaper.alive() and consumer.alive()


def test_sigkill_mid_job_is_requeued_within_lease_and_run_by_another(db: SyncDB, procs: Procs,
                                                                     settings: Settings,
                                                                     report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    procs.reaper()
    a = procs.consumer()
    a_id = a.worker_id()
    (jid,) = publish(settings, "work", [{"sleep_first": 30, "sleep": 0.2}])
    wait_until(lambda: runs(db, jid), 10, "the job to start in A")
    a.kill()
    latency = requeue_latency(db, jid, time.monotonic(), LEASE_S + SLACK_S + 2)
    assert latency <= LEASE_S + SLACK_S, f"requeued {latency:.2f}s after the kill"
    b = procs.consumer()
    b_id = b.worker_id()
    wait_until(lambda: job(db, jid)["status"] == "completed", 10, "completion by B")
    row = job(db, jid)
    history = runs(db, jid)
    assert [r["worker"] for r in history] == [a_id, b_id]
    assert history[0]["outcome"] is None and history[1]["outcome"] == "returned"
    assert row["worker_id"] == b_id and row["attempts"] == 2 and row["stalls"] == 1
    report("SIGKILL consumer mid-handler", 1, *lost_and_duplicates(db, [jid]), [latency])


def test_zombie_cannot_renew_or_complete_and_stops_its_handler(db: SyncDB, procs: Procs,
                                                               settings: Settings,
                                                               report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    procs.reaper()
    a = procs.consumer()
    a_id = a.worker_id()
    (jid,) = publish(settings, "work", [{"sleep": 1.5}])
    wait_until(lambda: runs(db, jid), 10, "the job to start in A")
    a.signal(signal.SIGSTOP)
    latency = requeue_latency(db, jid, time.monotonic(), LEASE_S + SLACK_S + 2)
    assert latency <= LEASE_S + SLACK_S
    b = procs.consumer()
    b_id = b.worker_id()
    # The republished id may first go to frozen A's prefetch buffer; the broker
    # hands it on once A misses its AMQP heartbeats (2 s here).
    wait_until(lambda: len(runs(db, jid)) == 2, 15, "B to start the job")
    b_lock = job(db, jid)["lock"]
    a.signal(signal.SIGCONT)
    # A wakes up holding a lapsed lease: it must stop its handler, not finish it.
    a.wait_log(r"(lease not renewed in time|lease lost)", 10)
    wait_until(lambda: runs(db, jid)[0]["outcome"] == "cancelled", 10, "A's handler cancelled")
    wait_until(lambda: job(db, jid)["status"] == "completed", 10, "B completes")
    row = job(db, jid)
    assert row["worker_id"] == b_id and row["lock"] == b_lock
    assert [r["worker"] for r in runs(db, jid)] == [a_id, b_id]
    assert f"event=completed job={jid}" not in a.log()
    assert a.alive(), "the zombie keeps serving other jobs"
    report("SIGSTOP past the lease, then SIGCONT (zombie)", 1, *lost_and_duplicates(db, [jid]),
           [latency])


def test_job_of_death_fails_after_max_stalls(db: SyncDB, procs: Procs, settings: Settings,
                                             report: Any) -> None:
    set_queue(db, "suicide", lease_s=LEASE_S, max_stalls=2, stall_cooldown_s=0.1)
    procs.reaper()
    (jid,) = publish(settings, "suicide", [{}])
    consumer = procs.consumer("--queue", "suicide")
    deadline = time.monotonic() + 30
    while job(db, jid)["status"] != "failed":
        assert time.monotonic() < deadline, f"not failed: {dict(job(db, jid))}"
        if not consumer.alive():  # an orchestrator would restart it
            consumer = procs.consumer("--queue", "suicide")
        time.sleep(0.05)
    row = job(db, jid)
    assert row["stalls"] == 3
    assert "job of death" in row["last_error"] and "max_stalls=2" in row["last_error"]
    assert len(runs(db, jid)) == 3  # ran max_stalls + 1 times, then never again
    # An absence cannot be waited for: give a wrongly requeued run a lease to show up.
    time.sleep(LEASE_S)
    assert len(runs(db, jid)) == 3
    lost = int(job(db, jid)["status"] != "failed")  # a job of death ends failed, not lost
    report("job of death (handler SIGKILLs its process)", 1, lost, len(runs(db, jid)) - 1)


def test_two_reapers_requeue_each_lapsed_lease_once(db: SyncDB, procs: Procs, settings: Settings,
                                                    report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    r1, r2 = procs.reaper(), procs.reaper()
    a = procs.consumer("--concurrency", "20")
    a.worker_id()
    ids = publish(settings, "work", [{"sleep_first": 60} for _ in range(20)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 20, 15, "20 jobs running")
    a.kill()
    killed = time.monotonic()
    # One worker held all 20: each is requeued once, as a suspect (not charged).
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE suspect_stalls = 1") == 20,
               LEASE_S + SLACK_S + 3, "all 20 requeued", interval=0.01)
    latency = time.monotonic() - killed
    assert latency <= LEASE_S + SLACK_S
    b = procs.consumer("--concurrency", "20")
    b.worker_id()
    wait_until(lambda: completed(db, ids), 20, "all completed by B")
    assert db.val("SELECT max(stalls + suspect_stalls) FROM jobq.job") == 1
    logs = r1.log() + r2.log()
    for jid in ids:
        assert logs.count(f"event=stalled job={jid}") == 1, jid
    lost, dups = lost_and_duplicates(db, ids)
    report("2 reapers, consumer with 20 jobs SIGKILLed", 20, lost, dups, [latency])


def test_sigterm_drains_finishes_short_and_releases_long_jobs(db: SyncDB, procs: Procs,
                                                              settings: Settings,
                                                              report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    a = procs.consumer("--concurrency", "4")  # no reaper: release must republish itself
    a.worker_id()
    short = publish(settings, "work", [{"sleep": 0.5}, {"sleep": 0.5}])
    long_ = publish(settings, "work", [{"sleep_first": 60}, {"sleep_first": 60}])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 4, 10, "4 jobs running")
    a.signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    assert a.wait(15) == 0
    assert time.monotonic() - stopped_at < 2 + 3  # grace (2 s) plus bookkeeping
    assert completed(db, short)
    for jid in long_:
        row = job(db, jid)
        assert row["status"] == "queued" and row["stalls"] == 0 and row["errors"] == 0
        assert row["published_at"] is not None, "released jobs are republished at once"
    b = procs.consumer("--concurrency", "4")
    b.worker_id()
    wait_until(lambda: completed(db, long_), 10, "released jobs completed by B")
    assert db.val("SELECT max(stalls) FROM jobq.job") == 0
    assert "released (worker shutting down)" in a.log()
    lost, dups = lost_and_duplicates(db, short + long_)
    report("SIGTERM with 4 jobs in flight (2 released)", 4, lost, dups)


def _ready_in_broker(settings: Settings, queue: Any) -> int:
    async def go() -> int:
        broker = Broker(settings.amqp_url, settings.namespace)
        await broker.connect(wait=False)
        try:
            return await broker.ready_count(queue)
        finally:
            await broker.close()

    return asyncio.run(go())


def test_sigterm_with_every_slot_busy_requeues_the_waiting_deliveries(db: SyncDB, procs: Procs,
                                                                      settings: Settings) -> None:
    """Deliveries waiting in the consumer for a free slot when SIGTERM comes
    are handed back to the broker unclaimed; the jobs running are released."""
    set_queue(db, "work", lease_s=LEASE_S)
    a = procs.consumer("--concurrency", "2")  # prefetch 2: two more can wait in A
    a_id = a.worker_id()
    long_ = publish(settings, "work", [{"sleep_first": 60}, {"sleep_first": 60}])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 2, 10, "2 jobs running")
    waiting = publish(settings, "work", [{}, {}, {}])
    wait_until(lambda: _ready_in_broker(settings, "work") == 1, 10,
               "two deliveries waiting in A for a slot")
    a.signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    assert a.wait(15) == 0
    assert time.monotonic() - stopped_at < 2 + 3  # grace (2 s) plus bookkeeping
    assert db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND attempts > 0",
                  waiting) == 0, "A claimed a job it had no slot for"
    b = procs.consumer("--concurrency", "4")
    b.worker_id()
    wait_until(lambda: completed(db, long_ + waiting), 15, "all five completed by B")
    assert [r["worker"] for j in waiting for r in runs(db, j)] == [b.worker_id()] * 3
    assert all(runs(db, j)[0]["worker"] == a_id for j in long_)
    assert db.val("SELECT max(stalls) FROM jobq.job") == 0
    assert lost_and_duplicates(db, waiting) == (0, 0)


def test_producer_dies_between_commit_and_publish(db: SyncDB, env: dict[str, str], procs: Procs,
                                                  report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    out = run_cli({**env, "JOBQ_CRASH_AT": "producer.after_commit"}, "publish", "work", "{}")
    assert out.returncode == -signal.SIGKILL
    row = db.fetchrow("SELECT * FROM jobq.job")
    assert row["status"] == "queued" and row["published_at"] is None
    procs.reaper()
    procs.consumer().worker_id()
    wait_until(lambda: job(db, row["id"])["status"] == "completed", 10, "relay + completion")
    assert len(runs(db, row["id"])) == 1
    report("crash: producer.after_commit", 1, *lost_and_duplicates(db, [row["id"]]))


def test_a_burst_is_claimed_in_batches_and_every_delivery_is_settled(db: SyncDB, procs: Procs,
                                                                     settings: Settings) -> None:
    """Deliveries are claimed in batches and acked with one multiple=True ack
    per batch: each job runs once, and no delivery is left unacked (a second
    consumer would be handed any such id again when the first one dies)."""
    ids = publish(settings, "work", [{} for _ in range(400)])  # a backlog, then the consumer
    a = procs.consumer("--queue", "work", "--concurrency", "32")
    wait_until(lambda: completed(db, ids), 60, "the backlog to complete")
    assert lost_and_duplicates(db, ids) == (0, 0)
    # started_at is now() of the claim's transaction: one value per statement.
    claims = db.val("SELECT count(DISTINCT started_at) FROM jobq.job WHERE id = ANY($1)", ids)
    print(f"{claims} claim statements for {len(ids)} jobs")
    assert claims < len(ids), "every claim went out alone"
    a.kill()  # unacked deliveries, if any, go back to the queue now
    b = procs.consumer("--queue", "work", "--concurrency", "8")
    b.worker_id()
    (marker,) = publish(settings, "work", [{}])
    wait_until(lambda: completed(db, [marker]), 20, "the marker job to complete")
    assert "duplicate delivery" not in b.log() + a.log()
    assert lost_and_duplicates(db, ids) == (0, 0)
