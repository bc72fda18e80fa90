"""Seeing everything (issue #5): views, job history, the inspection CLI,
cancellation, metrics and structured logs, on real services and processes."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import pytest

from harness.helpers import (
    Procs,
    SyncDB,
    free_port,
    http,
    job,
    publish,
    run_cli,
    runs,
    set_queue,
    wait_until,
)
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def events(db: SyncDB, jid: Any) -> list[Any]:
    return [(r["event"], r["worker_id"]) for r in db.fetch(
        "SELECT event, worker_id FROM jobq.history WHERE job_id = $1 ORDER BY at, n", jid)]


def metric(port: int, line_start: str) -> float:
    text = http(f"http://127.0.0.1:{port}/metrics")[1].decode()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_stalled_job_is_visible_before_the_reaper_and_its_history_says_why_it_ran_twice(
        db: SyncDB, procs: Procs, settings: Settings, env: dict[str, str]) -> None:
    set_queue(db, "work", lease_s=1)
    a = procs.consumer()
    a_id = a.worker_id()
    (jid,) = publish(settings, "work", [{"sleep_first": 60}])
    wait_until(lambda: runs(db, jid), 10, "A runs the job")
    a.kill()
    # No reaper yet: SQL alone shows the job as stalled, not running.
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.stalled WHERE id = $1", jid) == 1,
               15, "the job in jobq.stalled")
    stats = db.fetchrow("SELECT * FROM jobq.queue_stats WHERE queue = 'work'")
    assert (stats["stalled"], stats["running"]) == (1, 0)
    assert db.fetchrow("SELECT * FROM jobq.overdue")["overdue_leases"] == 1
    assert "1 (!)" in run_cli(env, "stats").stdout
    reaper_port = free_port()
    procs.reaper(JOBQ_HEALTH_PORT=str(reaper_port))
    b = procs.consumer()
    b_id = b.worker_id()
    wait_until(lambda: job(db, jid)["status"] == "completed", 10, "B completes it")
    # The producer's "published" mark is skipped when a consumer claimed the
    # row first (the claim holds it); every other step is always recorded.
    story = [e for e in events(db, jid) if e[0] != "published"]
    assert story == [
        ("enqueued", None), ("claimed", a_id),
        ("worker_vanished", a_id),  # A's session ended: lease cut to the grace
        ("stalled", story[3][1]),
        # it died alone, so it is now a suspect: B runs it isolated
        ("claimed", b_id), ("isolated", b_id), ("completed", b_id)]
    assert story[3][1].startswith("reaper-")
    full = [e for e, _ in events(db, jid)]
    assert "published" in full[full.index("stalled"):]  # republished by the relay
    detail = db.val("SELECT detail FROM jobq.history WHERE job_id = $1 AND event = 'stalled'",
                    jid)
    assert f"lease of worker {a_id} lapsed" in detail
    assert db.fetchrow("SELECT * FROM jobq.stalled_ever WHERE id = $1", jid)["stalls"] == 1
    shown = run_cli(env, "inspect", str(jid)).stdout
    assert "stalled" in shown and a_id in shown and b_id in shown
    # Monitor the monitor: the reaper's sweeps are visible in SQL and metrics.
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.reaper_status "
                              "WHERE seconds_since_sweep < 5"), 5, "a recent sweep")
    assert metric(reaper_port, "jobq_jobs_stalled_total{queue=\"work\"}") == 1
    assert time.time() - metric(reaper_port, "jobq_reaper_last_sweep_timestamp_seconds") < 5
    assert metric(reaper_port, "jobq_leases_overdue") == 0


def test_cancel_a_running_job_stops_its_handler_at_the_next_renewal(db: SyncDB, procs: Procs,
                                                                    settings: Settings,
                                                                    env: dict[str, str]) -> None:
    set_queue(db, "work", lease_s=1)
    procs.reaper()
    port = free_port()
    c = procs.consumer(JOBQ_HEALTH_PORT=str(port))
    c.worker_id()
    (jid,) = publish(settings, "work", [{"sleep": 60}])
    wait_until(lambda: runs(db, jid), 10, "the job runs")
    out = run_cli(env, "cancel", str(jid), "--reason", "customer asked")
    assert out.returncode == 0 and "cancelled" in out.stdout
    wait_until(lambda: runs(db, jid)[0]["outcome"] == "cancelled", 3, "handler stopped")
    row = job(db, jid)
    assert row["status"] == "cancelled" and row["last_error"] == "customer asked"
    # The operator's cancel, by its login, not by the job's worker; the
    # worker stops the handler without a "lease lost" fault (#50.10)
    assert [e for e, _ in events(db, jid)][-1] == "cancelled", events(db, jid)
    ev = db.fetchrow("SELECT worker_id, detail FROM jobq.job_event WHERE job_id = $1 "
                     "AND event = 'cancelled'", jid)
    assert ev["worker_id"] is None and ev["detail"].startswith("customer asked (by "), dict(ev)
    c.wait_log("job cancelled while it ran")  # at its next renewal
    assert "lease lost" not in c.log(), c.log()[-2000:]
    assert metric(port, 'jobq_leases_lost_total{queue="work"}') == 0
    time.sleep(1.5)
    assert job(db, jid)["status"] == "cancelled" and len(runs(db, jid)) == 1
    # queued jobs cancel at once; finished ones cannot be cancelled
    (later,) = publish(settings, "work", [{}])
    wait_until(lambda: job(db, later)["status"] == "completed", 10, "later completes")
    out = run_cli(env, "cancel", str(later))
    assert out.returncode == 1 and "already completed" in out.stderr


def test_retry_prune_and_errors_of_the_cli(db: SyncDB, procs: Procs, settings: Settings,
                                           env: dict[str, str]) -> None:
    set_queue(db, "work", lease_s=1, max_attempts=1)
    # The CLI's prune is under test: the reaper's own retention (every 60 s,
    # keep_completed_s 1 day) would delete the back-dated rows first on a
    # machine slow enough that this test passes the minute.
    procs.reaper(JOBQ_REAPER__PRUNE_EVERY_S="0")
    port = free_port()
    procs.consumer(JOBQ_HEALTH_PORT=str(port)).worker_id()
    (bad,) = publish(settings, "work", [{"fail_times": 1}])
    wait_until(lambda: job(db, bad)["status"] == "failed", 10, "the job fails")
    assert db.val("SELECT count(*) FROM jobq.failed WHERE id = $1", bad) == 1
    shown = run_cli(env, "inspect", str(bad)).stdout  # where it failed (issue #50)
    assert "last traceback:" in shown and "in _work" in shown, shown
    assert 'raise RuntimeError(f"boom on attempt {job.attempt}")' in shown, shown
    out = run_cli(env, "retry", str(bad))
    assert out.returncode == 0, out.stderr
    wait_until(lambda: job(db, bad)["status"] == "completed", 10, "retried job completes")
    assert [e for e, _ in events(db, bad)].count("retried") == 1
    assert run_cli(env, "retry", str(bad)).returncode == 1  # completed: nothing to retry
    assert run_cli(env, "retry", str(uuid.uuid4())).stderr.startswith("jobq: error: no job")
    assert metric(port, 'jobq_jobs_failed_total{queue="work"}') == 1
    assert metric(port, 'jobq_jobs_completed_total{queue="work"}') == 1
    assert metric(port, 'jobq_handler_duration_seconds_count{outcome="ok",queue="work"}') == 1

    (napper,) = publish(settings, "work", [{"snooze_runs": 1, "snooze_s": 0.2}])
    wait_until(lambda: job(db, napper)["status"] == "completed", 10, "the snoozed job ends")
    shown = run_cli(env, "inspect", str(napper)).stdout  # a snooze is no failure (issue #51)
    assert re.search(r"^snoozes\s+1$", shown, re.M), shown
    assert re.search(r"^errors\s+0$", shown, re.M), shown

    publish(settings, "work", [{} for _ in range(5)])
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") == 7,
               10, "all complete")
    db.execute("UPDATE jobq.job SET finished_at = now() - interval '2 days'")
    (fresh,) = publish(settings, "work", [{}])
    wait_until(lambda: job(db, fresh)["status"] == "completed", 10, "fresh completes")
    out = run_cli(env, "prune", "--older-than", "1d", "--batch", "2")
    assert out.returncode == 0 and "pruned 7" in out.stdout, out.stdout + out.stderr
    assert db.val("SELECT count(*) FROM jobq.job") == 1
    assert db.val("SELECT count(*) FROM jobq.job_event WHERE job_id <> $1", fresh) == 0
    for bad_duration in ("soon", "-3d", "7x"):
        out = run_cli(env, "prune", f"--older-than={bad_duration}")
        assert out.returncode == 1 and "bad duration" in out.stderr, out.stderr


def test_history_can_be_switched_off_per_queue(db: SyncDB, procs: Procs, settings: Settings,
                                               env: dict[str, str]) -> None:
    assert run_cli(env, "queue", "set", "quiet", "--history", "off").returncode == 0
    c = run_cli(env, "consume", "harness.apps:app", "--queue", "quiet")
    assert c.returncode == 2  # the test app has no 'quiet' handler: refused, not run
    # A delay is what an enqueue still records (the row does not keep it).
    quiet, loud = (db.val("SELECT jobq.enqueue($1, '{}', 30)", q) for q in ("quiet", "loud"))
    assert db.val("SELECT count(*) FROM jobq.job_event WHERE job_id = $1", quiet) == 0
    assert db.val("SELECT count(*) FROM jobq.job_event WHERE job_id = $1", loud) == 1
    assert run_cli(env, "queue", "set", "quiet", "--history", "maybe").returncode == 1


def test_json_logs_carry_job_queue_attempt_and_worker(db: SyncDB, procs: Procs,
                                                      settings: Settings) -> None:
    c = procs.consumer(JOBQ_LOG_JSON="true")
    wait_until(lambda: '"msg": "consumer ready"' in c.log(), 15, "ready line")
    (jid,) = publish(settings, "work", [{}])
    wait_until(lambda: job(db, jid)["status"] == "completed", 10, "completion")
    wait_until(lambda: '"event": "completed"' in c.log(), 5, "completed line")
    lines = [json.loads(ln) for ln in c.log().splitlines() if ln.startswith("{")]
    done = [ln for ln in lines if ln.get("event") == "completed"]
    assert done and done[0]["job"] == str(jid) and done[0]["queue"] == "work"
    assert done[0]["attempt"] == 1 and done[0]["worker"]
