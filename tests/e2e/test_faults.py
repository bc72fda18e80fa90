"""Fault injection (issue #3): real processes die at named crash points
(JOBQ_CRASH_AT) and under signals, PostgreSQL and RabbitMQ restart under
load. Each scenario asserts from the database that nothing was lost, how many
times each handler started, and how fast the reaper noticed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from harness.helpers import (
    LEASE_S,
    SLACK_S,
    Procs,
    SyncDB,
    job,
    lost_and_duplicates,
    publish,
    requeue_latency,
    runs,
    set_queue,
    wait_until,
)
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def died_by_sigkill(proc: Any, timeout: float = 15) -> float:
    """Wait for a process that kills itself at a crash point; return when."""
    assert proc.wait(timeout) == -signal.SIGKILL, proc.log()[-2000:]
    return time.monotonic()


def test_crash_before_claim_redelivers_the_message(db: SyncDB, procs: Procs, settings: Settings,
                                                   report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    procs.reaper()
    a = procs.consumer(JOBQ_CRASH_AT="consumer.before_claim")
    a.worker_id()
    (jid,) = publish(settings, "work", [{}])
    died_by_sigkill(a)
    b = procs.consumer()
    wait_until(lambda: job(db, jid)["status"] == "completed", 15, "completion by B")
    row = job(db, jid)
    assert (row["attempts"], row["stalls"], row["worker_id"]) == (1, 0, b.worker_id())
    report("crash: consumer.before_claim", 1, *lost_and_duplicates(db, [jid]))


def test_crash_between_claim_and_ack(db: SyncDB, procs: Procs, settings: Settings,
                                     report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    procs.reaper()
    a = procs.consumer(JOBQ_CRASH_AT="consumer.after_claim")
    a_id = a.worker_id()
    (jid,) = publish(settings, "work", [{}])
    killed = died_by_sigkill(a)
    assert job(db, jid)["status"] == "active" and job(db, jid)["worker_id"] == a_id
    b = procs.consumer()  # gets the redelivered id first: its claim fails, it drops it
    latency = requeue_latency(db, jid, killed, LEASE_S + SLACK_S + 2)
    wait_until(lambda: job(db, jid)["status"] == "completed", 15, "completion by B")
    row = job(db, jid)
    assert (row["attempts"], row["stalls"], row["worker_id"]) == (2, 1, b.worker_id())
    assert [r["worker"] for r in runs(db, jid)] == [b.worker_id()]  # A never started it
    assert latency <= LEASE_S + SLACK_S
    report("crash: consumer.after_claim (before ack)", 1, *lost_and_duplicates(db, [jid]),
           [latency])


def test_crash_after_side_effect_before_completion(db: SyncDB, procs: Procs, settings: Settings,
                                                   report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    procs.reaper()
    a = procs.consumer(JOBQ_CRASH_AT="consumer.after_handler")
    a_id = a.worker_id()
    (jid,) = publish(settings, "work", [{}])
    killed = died_by_sigkill(a)
    latency = requeue_latency(db, jid, killed, LEASE_S + SLACK_S + 2)
    b = procs.consumer()
    wait_until(lambda: job(db, jid)["status"] == "completed", 15, "completion by B")
    history = runs(db, jid)
    # At least once, said plainly: the side effect ran twice, with two tokens.
    assert [(r["worker"], r["outcome"]) for r in history] == [(a_id, "returned"),
                                                             (b.worker_id(), "returned")]
    assert history[0]["lock"] != history[1]["lock"]
    assert latency <= LEASE_S + SLACK_S
    report("crash: consumer.after_handler (before complete)", 1,
           *lost_and_duplicates(db, [jid]), [latency])


@pytest.mark.parametrize("point", ["reaper.after_requeue", "reaper.mid_relay"])
def test_reaper_dies_mid_sweep(db: SyncDB, procs: Procs, settings: Settings, report: Any,
                               point: str) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    r1 = procs.reaper(JOBQ_CRASH_AT=point)
    a = procs.consumer()
    a.worker_id()
    ids = publish(settings, "work", [{"sleep_first": 60} for _ in range(3)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 3, 10, "3 jobs running")
    # Claimed in one batch or several, the three share a deadline once one
    # renewal (one statement for all) has run: so they lapse in one sweep,
    # and the reaper dies after requeueing all three (under load, claims in
    # two batches once left one lease lapsing a sweep ahead of the others).
    wait_until(lambda: db.val("SELECT count(DISTINCT lease_expires_at) FROM jobq.job "
                              "WHERE status = 'active'") == 1, 10, "one shared lease deadline")
    a.kill()
    killed = time.monotonic()
    died_by_sigkill(r1)
    # Requeued and committed; published or not, the rows say "not published".
    assert db.val("SELECT count(*) FROM jobq.job WHERE status = 'queued' "
                  "AND published_at IS NULL AND suspect_stalls = 1") == 3
    r2 = procs.reaper()
    procs.consumer().worker_id()
    wait_until(lambda: lost_and_duplicates(db, ids)[0] == 0, 15, "all completed")
    assert db.val("SELECT max(stalls + suspect_stalls) FROM jobq.job") == 1  # requeued once
    assert r2.alive()
    lost, dups = lost_and_duplicates(db, ids)
    assert lost == 0 and dups == 3  # each ran twice: once killed in A, once to completion
    report(f"crash: {point}", 3, lost, dups, [time.monotonic() - killed])


def test_three_reapers_one_frozen(db: SyncDB, procs: Procs, settings: Settings,
                                  report: Any) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    reapers = [procs.reaper() for _ in range(3)]
    for r in reapers:
        r.wait_log("reaper ready")
    reapers[0].signal(signal.SIGSTOP)  # frozen, maybe holding relay locks
    a = procs.consumer("--concurrency", "10")
    a.worker_id()
    ids = publish(settings, "work", [{"sleep_first": 60} for _ in range(10)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 10, 10, "10 jobs running")
    a.kill()
    killed = time.monotonic()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE suspect_stalls = 1") == 10,
               LEASE_S + SLACK_S + 2, "all requeued by the live reapers")
    latency = time.monotonic() - killed
    procs.consumer("--concurrency", "10").worker_id()
    wait_until(lambda: lost_and_duplicates(db, ids)[0] == 0, 15, "all completed")
    reapers[0].signal(signal.SIGCONT)
    time.sleep(1)
    assert db.val("SELECT max(stalls + suspect_stalls) FROM jobq.job") == 1
    logs = "".join(r.log() for r in reapers)
    for jid in ids:
        assert logs.count(f"event=stalled job={jid}") == 1
    assert latency <= LEASE_S + SLACK_S
    report("3 reapers, one frozen (SIGSTOP)", 10, *lost_and_duplicates(db, ids), [latency])


def test_poison_job_kills_its_worker_until_it_fails_alone(db: SyncDB, procs: Procs,
                                                          settings: Settings, report: Any) -> None:
    """A handler that SIGKILLs its own process every time: job of death after
    max_stalls, while healthy jobs around it complete."""
    set_queue(db, "work", lease_s=LEASE_S, max_stalls=2, stall_cooldown_s=0.1)
    procs.reaper()
    healthy = publish(settings, "work", [{"sleep": 0.05} for _ in range(20)])
    (poison,) = publish(settings, "work", [{"kill_on_attempt": 99}])
    consumer = procs.consumer()
    deadline = time.monotonic() + 40
    while job(db, poison)["status"] != "failed" or lost_and_duplicates(db, healthy)[0]:
        assert time.monotonic() < deadline, dict(job(db, poison))
        if not consumer.alive():
            consumer = procs.consumer()
        time.sleep(0.05)
    row = job(db, poison)
    assert row["stalls"] == 3 and "job of death" in row["last_error"]
    # Up to two crashes may be shared with healthy jobs (witnessed, not
    # charged); after that it runs isolated, and every crash is charged.
    assert len(runs(db, poison)) == row["stalls"] + row["suspect_stalls"]
    assert row["suspect_stalls"] <= 2
    lost, dups = lost_and_duplicates(db, healthy)
    report("poison job (kills its worker)", 21, lost, dups)


def _local(url: str, port: int) -> bool:
    u = urlsplit(url)
    return u.hostname in ("127.0.0.1", "localhost") and (u.port or port) == port


def restart_postgres(settings: Settings) -> None:
    if not (_local(settings.database_url, 5432) and shutil.which("pg_ctlcluster")):
        pytest.skip("restarts need the local PostgreSQL cluster (pg_ctlcluster)")
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
                   check=True, capture_output=True, timeout=120)


def restart_rabbitmq(settings: Settings) -> None:
    if not (_local(settings.amqp_url, 5672) and shutil.which("rabbitmqctl")):
        pytest.skip("restarts need the local RabbitMQ node (rabbitmqctl)")
    for cmd in (["stop_app"], ["start_app"], ["await_startup"]):
        subprocess.run(["rabbitmqctl", *cmd], check=True, capture_output=True, timeout=120)


@pytest.mark.exclusive  # restarts the shared servers: run alone (Makefile)
@pytest.mark.parametrize("service", ["PostgreSQL", "RabbitMQ"])
def test_restart_under_load(db: SyncDB, procs: Procs, settings: Settings, report: Any,
                            service: str) -> None:
    set_queue(db, "work", lease_s=5)
    procs.reaper()
    procs.consumer("--concurrency", "8").worker_id()
    procs.consumer("--concurrency", "8").worker_id()
    ids = publish(settings, "work", [{"sleep": 0.2} for _ in range(300)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") > 30, 15, "load running")
    (restart_postgres if service == "PostgreSQL" else restart_rabbitmq)(settings)
    ids += publish(settings, "work", [{"sleep": 0.05} for _ in range(50)])  # after the restart
    wait_until(lambda: lost_and_duplicates(db, ids)[0] == 0, 90, "every job completed")
    lost, dups = lost_and_duplicates(db, ids)
    # A rerun is only allowed for a job whose lease lapsed or whose handler
    # failed (the test handler itself writes to the restarted database).
    assert dups <= db.val("SELECT coalesce(sum(stalls + suspect_stalls + errors), 0) "
                          "FROM jobq.job")
    report(f"{service} restarted under load", len(ids), lost, dups)
