"""The live invariant monitor (issue #50, item 8), with real processes: a
run with SIGKILLed consumers (re-runs, lapsed leases, requeues) leaves it at
0; a second lease forged by SQL on a running job is counted by the reapers
within 5 s (jobq_invariant_violations_total, jobq.invariant_violation), and
so is a completion forged without the lease; ``jobq audit`` exits 1 and
names them, ``jobq audit ID`` shows the runs that break one; leases and
ready jobs left behind past the grace are found by ``jobq audit --grace``."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.helpers import (
    LEASE_S,
    Procs,
    SyncDB,
    completed,
    free_port,
    http,
    publish,
    run_cli,
    runs,
    set_queue,
    wait_until,
)
from jobq.settings import Settings
from tests.integration.test_cli import one_line_error

pytestmark = pytest.mark.e2e


def _violations(port: int) -> dict[str, float]:
    status, body = http(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return {s.labels["kind"]: s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples
            if s.name == "jobq_invariant_violations_total"}


def test_crashes_leave_the_monitor_at_zero_and_a_forged_lease_is_caught_within_5s(
        db: SyncDB, procs: Procs, settings: Settings, env: dict[str, str]) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    ports = [free_port(), free_port()]
    for port in ports:  # two peers: a violation is counted once, by one of them
        procs.reaper(JOBQ_HEALTH_PORT=str(port), JOBQ_REAPER__AUDIT_EVERY_S="0.5")
    victims = [procs.consumer("--concurrency", "4") for _ in range(2)]
    for v in victims:
        v.worker_id()
    ids = publish(settings, "work", [{"sleep": 0.3} for _ in range(24)])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run") >= 6, 20, "jobs running")
    for v in victims:  # their jobs lapse, are requeued and run again elsewhere
        v.kill()
    procs.consumer("--concurrency", "8").worker_id()
    wait_until(lambda: completed(db, ids), 60, "every job completed")
    assert db.val("SELECT count(*) FROM jobq.job_event WHERE event = 'stalled'") > 0
    clean = run_cli(env, "audit")
    assert clean.returncode == 0 and "no invariant violations" in clean.stdout, (
        clean.stdout, clean.stderr)

    # A second live lease, forged: a running job claimed again by another
    # worker without its claim having ended.
    (held,) = publish(settings, "work", [{"sleep": 30}])
    wait_until(lambda: runs(db, held), 20, "the long job to start")
    owner = db.val("SELECT worker_id FROM jobq.job WHERE id = $1", held)
    forged_at = time.monotonic()
    db.execute("INSERT INTO jobq.job_event (job_id, event, worker_id, attempt) "
               "VALUES ($1, 'claimed', 'forger', 1)", held)
    got = wait_until(lambda: sum(_violations(p).get("two_live_leases", 0) for p in ports) or None,
                     30, "the forged lease counted")
    caught_s = time.monotonic() - forged_at
    print(f"forged second lease counted after {caught_s:.2f} s")
    assert got == 1 and caught_s <= 5, (got, caught_s)
    row = db.fetchrow("SELECT * FROM jobq.invariant_violation WHERE job_id = $1", held)
    assert row["kind"] == "two_live_leases" and "forger" in row["detail"]
    assert owner in row["detail"]

    # A completion the lease did not allow: the row says completed by a
    # worker that never held this job's claim.
    (other,) = publish(settings, "work", [{"sleep": 30}])
    wait_until(lambda: runs(db, other), 20, "the second long job to start")
    db.execute("UPDATE jobq.job SET status = 'completed', worker_id = 'forger', "
               "finished_at = now(), lease_expires_at = NULL WHERE id = $1", other)
    wait_until(lambda: sum(_violations(p).get("completed_without_lease", 0) for p in ports)
               or None, 30, "the forged completion counted")

    bad = run_cli(env, "audit")
    one_line_error(bad, 1, "2 invariant violation(s)")
    assert str(held) in bad.stdout and str(other) in bad.stdout
    one = run_cli(env, "audit", str(held))
    assert one.returncode == 1 and "2 run(s)" in one.stdout and "forger" in one.stdout, one.stdout


def test_audit_finds_a_lease_and_a_job_left_behind_past_the_grace(
        db: SyncDB, settings: Settings, env: dict[str, str]) -> None:
    set_queue(db, "left")
    stuck, unsent, fine = publish(settings, "left", [{}, {}, {}])
    # No reaper runs: a lease lapsed 10 s ago stays active, a due row stays
    # unpublished (written as a crash of every reaper would leave them).
    db.execute("UPDATE jobq.job SET status = 'active', lock = gen_random_uuid(), "
               "worker_id = 'gone', lease_expires_at = now() - interval '10 s' WHERE id = $1",
               stuck)
    db.execute("UPDATE jobq.job SET published_at = NULL, relay_after = now() - interval '10 s', "
               "run_at = now() - interval '10 s' WHERE id = $1", unsent)
    assert run_cli(env, "audit").returncode == 0  # within the default grace (60 s)
    out = run_cli(env, "audit", "--grace", "5")
    one_line_error(out, 1, "2 invariant violation(s)")
    kinds = {r["job_id"]: r["kind"]
             for r in db.fetch("SELECT job_id, kind FROM jobq.invariant_violation")}
    assert kinds == {stuck: "overdue_lease", unsent: "unpublished"}, kinds
    assert fine not in kinds
    one_line_error(run_cli(env, "audit", "--grace", "1"), 1, "at least 5 seconds")
    one_line_error(run_cli(env, "audit", "not-an-id"), 1)
