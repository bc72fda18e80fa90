"""``--pool process`` (issue #12): sync handlers in child processes. A child's
death is charged to exactly the job it ran, at once; lease loss, timeouts
and shutdown stop the child, which a thread never could."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from harness.helpers import (
    Proc,
    Procs,
    SyncDB,
    job,
    lost_and_duplicates,
    publish,
    runs,
    set_queue,
    wait_until,
)
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def pool_consumer(procs: Procs, n: int = 4, *extra: str, **env: str) -> Proc:
    c = procs.consumer("--queue", "proc", "--pool", "process", "--concurrency", str(n),
                       *extra, environ=env)
    c.worker_id()
    return c


def dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0): look at its state; reaped in between
    # (CI: ESRCH reading /proc/<pid>/stat) it is gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (ProcessLookupError, FileNotFoundError):
        return True


def test_a_dying_child_is_charged_to_its_own_job_only(db: SyncDB, procs: Procs, settings: Settings,
                                                      report: Any) -> None:
    set_queue(db, "proc", lease_s=30)
    procs.reaper()
    consumer = pool_consumer(procs)
    healthy = publish(settings, "proc", [{"sleep": 2} for _ in range(3)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") == 3, 15, "3 running")
    (killer,) = publish(settings, "proc", [{"kill_self_on_attempt": 1}])
    wait_until(lambda: job(db, killer)["status"] == "completed", 15, "the killer re-run")
    first, second = runs(db, killer)
    assert first["outcome"] is None and second["outcome"] == "returned"
    again_s = (second["started_at"] - first["started_at"]).total_seconds()
    # The parent knew at once: no wait for the 30 s lease. Any bound well
    # under the lease tells them apart, however loaded the machine.
    assert again_s < 30 / 3, again_s
    assert first["pid"] != second["pid"] and dead(first["pid"])  # its child was replaced
    row = job(db, killer)
    assert (row["stalls"], row["attempts"]) == (1, 2)
    wait_until(lambda: lost_and_duplicates(db, healthy)[0] == 0, 10, "healthy completed")
    for jid in healthy:  # untouched: started exactly once, never charged
        assert len(runs(db, jid)) == 1 and job(db, jid)["stalls"] == 0
    assert "child_died" in [r["event"] for r in db.fetch(
        "SELECT event FROM jobq.history WHERE job_id = $1", killer)]
    assert consumer.alive()
    report("--pool process: child SIGKILLed by its handler -> running again", 4, 0, 1,
           [again_s])


def test_a_job_that_always_kills_its_child_is_a_job_of_death(db: SyncDB, procs: Procs,
                                                             settings: Settings) -> None:
    set_queue(db, "proc", lease_s=30, max_stalls=2, stall_cooldown_s=0.1)
    procs.reaper()
    consumer = pool_consumer(procs, 2)
    (poison,) = publish(settings, "proc", [{"kill_self_on_attempt": 99}])
    (ok,) = publish(settings, "proc", [{"sleep": 0.1}])
    wait_until(lambda: job(db, poison)["status"] == "failed", 20, "job of death")
    row = job(db, poison)
    assert row["stalls"] == 3 and "job of death" in row["last_error"]
    assert len(runs(db, poison)) == 3
    wait_until(lambda: job(db, ok)["status"] == "completed", 10, "the other job")
    assert consumer.alive()


def test_a_hung_handler_past_its_timeout_is_killed_and_retried(db: SyncDB, procs: Procs,
                                                               settings: Settings) -> None:
    set_queue(db, "proc", lease_s=30, timeout_s=1, backoff_base_s=0.1)
    procs.reaper()
    pool_consumer(procs, 2)
    (jid,) = publish(settings, "proc", [{"hang_on_attempt": 1}])
    wait_until(lambda: job(db, jid)["status"] == "completed", 20, "the retry completes")
    first, second = runs(db, jid)
    assert first["outcome"] is None and second["outcome"] == "returned"
    wait_until(lambda: dead(first["pid"]), 5, "the hung child killed")
    row = job(db, jid)
    assert (row["attempts"], row["errors"], row["stalls"]) == (2, 1, 0)


def test_a_zombie_parent_stops_its_child_which_cannot_complete(db: SyncDB, procs: Procs,
                                                               settings: Settings) -> None:
    set_queue(db, "proc", lease_s=2, vanished_grace_s=2)
    procs.reaper()
    a = pool_consumer(procs, 2)
    (jid,) = publish(settings, "proc", [{"sleep": 6}])
    wait_until(lambda: runs(db, jid), 10, "the job runs in A's child")
    child = runs(db, jid)[0]["pid"]
    a.signal(signal.SIGSTOP)  # past the lease: the reaper hands the job on
    b = pool_consumer(procs, 2)
    wait_until(lambda: len(runs(db, jid)) == 2, 15, "B runs it")
    a.signal(signal.SIGCONT)  # A learns it lost the lease and stops its child
    wait_until(lambda: dead(child), 5, "A's child stopped")
    wait_until(lambda: job(db, jid)["status"] == "completed", 15, "B completes it")
    time.sleep(0.5)
    assert runs(db, jid)[0]["outcome"] is None  # A's run never returned
    assert job(db, jid)["worker_id"] == b.worker_id()
    assert a.alive()


def test_sigterm_in_process_mode_releases_unfinished_jobs(db: SyncDB, procs: Procs,
                                                          settings: Settings) -> None:
    set_queue(db, "proc", lease_s=30)
    procs.reaper()
    a = pool_consumer(procs, 2, JOBQ_CONSUMER__SHUTDOWN_GRACE_S="1")
    (jid,) = publish(settings, "proc", [{"sleep": 30}])
    wait_until(lambda: runs(db, jid), 10, "the job runs")
    child = runs(db, jid)[0]["pid"]
    a.signal(signal.SIGTERM)
    assert a.wait(15) == 0
    assert dead(child)
    row = job(db, jid)
    assert (row["status"], row["stalls"], row["suspect_stalls"]) == ("queued", 0, 0)
    assert "released" in [r["event"] for r in db.fetch(
        "SELECT event FROM jobq.history WHERE job_id = $1", jid)]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_large_payloads_and_results_cross_the_child_channel(db: SyncDB, procs: Procs,
                                                            settings: Settings, loop: Any) -> None:
    """Issue #28 M3: under uvloop a message larger than the socket buffer
    broke off halfway, and a 900 KB payload was failed as a job of death
    without its handler running. Results are checked in the child."""
    set_queue(db, "big", lease_s=30, max_result_bytes=6_000_000)
    procs.reaper()
    procs.consumer("--queue", "big", "--pool", "process", "--concurrency", "2",
                   JOBQ_EVENT_LOOP=loop).worker_id()
    payload, result, over, step = publish(settings, "big", [
        {"blob": "x" * 900_000}, {"result_bytes": 5_000_000}, {"result_bytes": 7_000_000},
        {"step": True}])
    wait_until(lambda: all(job(db, j)["status"] in ("completed", "failed")
                           for j in (payload, result, over, step)), 30, "all four ended")
    # A step in a child process can never run: failed at once, not retried
    # max_attempts times with backoff (found by hand: 5 attempts over 20 s).
    row = job(db, step)
    assert (row["status"], row["attempts"]) == ("failed", 1), row["last_error"]
    assert "--pool thread" in row["last_error"]
    got = db.fetchrow("SELECT status, stalls, result->>'got' AS got, "
                      "result->'secrets' AS secrets FROM jobq.job WHERE id = $1", payload)
    assert (got["status"], got["stalls"], got["got"]) == ("completed", 0, "900000")
    assert got["secrets"] == "[]"  # no JOBQ_*_URL in a handler's process
    assert db.val("SELECT length(result->>'blob') FROM jobq.job WHERE id = $1",
                  result) == 5_000_000
    row = job(db, over)
    assert (row["status"], row["stalls"]) == ("failed", 0)
    assert "max_result_bytes" in row["last_error"]


def test_a_healthy_job_survives_five_kills_of_its_process_pool_parent(db: SyncDB, procs: Procs,
                                                                      settings: Settings) -> None:
    """Issue #36: the parent's death is no evidence against a job whose
    handler runs in a child (a crashing handler kills the child, charged
    exactly: the job-of-death test above). Concurrency 1, so the job is
    always alone on its worker: before schema 0016 each outside SIGKILL
    charged it a stall, and the third made it a job of death."""
    set_queue(db, "proc", lease_s=30, max_stalls=2)
    procs.reaper()
    (jid,) = publish(settings, "proc", [{"sleep": 60}])
    for kill in range(5):
        c = pool_consumer(procs, 1)
        worker = c.worker_id()
        wait_until(lambda: job(db, jid)["worker_id"] == worker and
                   job(db, jid)["status"] == "active", 20, f"run {kill + 1}")
        c.signal(signal.SIGKILL)
        wait_until(lambda: job(db, jid)["status"] == "queued", 15, "requeued after the kill")
    row = job(db, jid)
    assert (row["status"], row["stalls"], row["suspect_stalls"]) == ("queued", 0, 0)
    details = [r["detail"] for r in db.fetch(
        "SELECT detail FROM jobq.job_event WHERE job_id = $1 AND event = 'stalled'", jid)]
    assert len(details) == 5 and all("child processes" in d for d in details), details
    assert all("session ended (the worker died" in d for d in details), details


def test_a_frozen_process_pool_parent_is_said_to_have_frozen_not_died(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    """Issue #50.10: a SIGSTOPped --pool process consumer's requeued job was
    told its worker had died; it froze, with its session alive."""
    set_queue(db, "proc", lease_s=2, max_stalls=2)
    procs.reaper()
    (jid,) = publish(settings, "proc", [{"sleep": 60}])
    c = pool_consumer(procs, 1)
    worker = c.worker_id()
    wait_until(lambda: job(db, jid)["worker_id"] == worker and
               job(db, jid)["status"] == "active", 20, "running")
    c.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: job(db, jid)["status"] == "queued", 15, "requeued while frozen")
    finally:
        c.signal(signal.SIGCONT)
    (detail,) = [r["detail"] for r in db.fetch(
        "SELECT detail FROM jobq.job_event WHERE job_id = $1 AND event = 'stalled'", jid)]
    assert "stopped renewing while its session lived (frozen" in detail, detail
    assert "died" not in detail.split(";")[0], detail
    assert job(db, jid)["stalls"] == 0


def _children(pid: int) -> list[int]:
    """The live child processes of a consumer (its handler pool)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return [c for c in found if not dead(c)]


def test_typed_tasks_and_deep_payloads_run_in_child_processes(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    """Issue #47 H4: a typed task's payload (a pydantic model in the parent)
    and a payload nested ~985 deep could not cross to a child: each lost a
    child that was never replaced, and two hung the consumer for good."""
    procs.reaper()
    procs.consumer("--queue", "proc_typed", "--queue", "big", "--pool", "process",
                   "--concurrency", "2").worker_id()
    deep = '{"d": ' * 985 + "{}" + "}" * 985  # as a SQL producer can write it
    nested = [db.val("SELECT jobq.enqueue('big', $1::jsonb)", deep) for _ in range(2)]
    (bad,) = publish(settings, "proc_typed", [{"to": 1}])
    good = publish(settings, "proc_typed", [{"to": f"u{i}@b.c", "subject": "hi"}
                                            for i in range(6)])
    everything = [bad, *nested, *good]
    wait_until(lambda: all(job(db, j)["status"] in ("completed", "failed")
                           for j in everything), 30, "every job ended")
    for jid in good:
        row = db.fetchrow("SELECT status, stalls, result->>'to' AS to FROM jobq.job "
                          "WHERE id = $1", jid)
        assert (row["status"], row["stalls"]) == ("completed", 0) and row["to"].endswith("@b.c")
    row = job(db, bad)
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "payload failed validation for queue proc_typed" in row["last_error"]
    for jid in nested:  # decoded, or failed with the reason: never a lost child
        row = job(db, jid)
        assert row["stalls"] == 0 and row["attempts"] == 1, row["last_error"]
        assert row["status"] == "completed" or "cannot be decoded" in row["last_error"]


def test_a_child_killed_while_idle_is_replaced_and_charges_nobody(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    """Issue #47 H4: an idle child's death was noticed only when the next
    job was sent to it, which was charged a stall it never caused, and the
    child was not replaced."""
    set_queue(db, "proc", lease_s=30)
    procs.reaper()
    consumer = pool_consumer(procs, 2)
    wait_until(lambda: len(_children(consumer.pid)) == 2, 10, "two children")
    victims = _children(consumer.pid)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    ids = publish(settings, "proc", [{"sleep": 0.1} for _ in range(6)])
    wait_until(lambda: all(job(db, j)["status"] == "completed" for j in ids), 20, "all ran")
    assert [job(db, j)["stalls"] for j in ids] == [0] * 6
    wait_until(lambda: len(_children(consumer.pid)) == 2, 10, "the pool back to two")
    assert not set(_children(consumer.pid)) & set(victims)


def test_a_child_handlers_traceback_is_kept_with_its_job(db: SyncDB, procs: Procs,
                                                        settings: Settings) -> None:
    """Issue #50: the traceback is formatted in the child, where its frames
    are, and kept with the job like a thread or async handler's."""
    set_queue(db, "proc", lease_s=30, max_attempts=1)
    procs.reaper()
    pool_consumer(procs, 1)
    (jid,) = publish(settings, "proc", [{"deep_key": True}])
    wait_until(lambda: job(db, jid)["status"] == "failed", 20, "the job failed")
    row = db.fetchrow("SELECT last_error, last_traceback FROM jobq.job WHERE id = $1", jid)
    assert "KeyError: 'x'" in row["last_error"], row
    tb = row["last_traceback"]
    assert tb.index("in settings_lookup") < tb.index("in read_setting"), tb
    assert 'harness/apps.py", line' in tb and tb.rstrip().endswith("KeyError: 'x'"), tb


def test_a_child_handler_can_snooze_and_rate_limit(db: SyncDB, procs: Procs,
                                                  settings: Settings) -> None:
    """Issue #51: jobq.Snooze and jobq.RateLimited cross the child channel
    with their seconds; neither run is counted."""
    set_queue(db, "proc", lease_s=30, max_attempts=1)
    procs.reaper()
    pool_consumer(procs, 2)
    snoozed, limited = publish(settings, "proc", [{"snooze_runs": 1, "snooze_s": 0.2},
                                                  {"rate_limit_s": 0.5}])
    for jid in (snoozed, limited):
        wait_until(lambda: all(job(db, j)["status"] == "completed" for j in (jid,)), 30,
                   "the job completed")
        row = db.fetchrow("SELECT attempts, snoozes, errors FROM jobq.job WHERE id = $1", jid)
        assert (row["attempts"], row["snoozes"], row["errors"]) == (1, 1, 0), dict(row)
    assert db.val("SELECT count(*) FROM jobq.key_hold WHERE queue = 'proc' AND key = ''") == 1
