"""A crash costs each of its jobs one re-run, and nothing more (I8, issue #12).

Every run of these jobs takes as long as the first (no `sleep_first`): a
recovery that ran the dead worker's jobs one after another, or shrank the
spare to one slot, shows up as late re-runs. Latencies are measured on the
database clock, from the kill to each job's second start, over *all* jobs.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, job, lost_and_duplicates, publish, set_queue, wait_until
from harness.load import rerun_latencies
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def _running(db: SyncDB, ids: Any, n_runs: int) -> int:
    n: int = db.val("SELECT count(*) FROM (SELECT job_id FROM test_run WHERE job_id = ANY($1) "
                    "GROUP BY job_id HAVING count(*) >= $2) t", ids, n_runs)
    return n


@pytest.mark.parametrize(("n", "lease_s"), [(8, 30.0), (8, 2.0), (32, 30.0)])
def test_a_dead_workers_jobs_all_run_again_at_once(db: SyncDB, procs: Procs, settings: Settings,
                                                   report: Any, n: int, lease_s: Any) -> None:
    set_queue(db, "work", lease_s=lease_s, vanished_grace_s=2)
    procs.reaper()
    a = procs.consumer("--concurrency", str(n))
    a.worker_id()
    ids = publish(settings, "work", [{"sleep": 5} for _ in range(n)])
    wait_until(lambda: _running(db, ids, 1) == n, 15, f"all {n} running in A")
    spare = procs.consumer("--concurrency", str(n))
    spare.worker_id()
    a.kill()
    killed_at = db.val("SELECT clock_timestamp()")
    wait_until(lambda: _running(db, ids, 2) == n, 15, f"all {n} running again", interval=0.05)
    latencies = rerun_latencies(db, ids, killed_at)
    wait_until(lambda: lost_and_duplicates(db, ids)[0] == 0, 20, "all completed")
    assert len(latencies) == n
    # The target: vanished_grace_s + 1 s over every job, not just the first.
    assert latencies[-1] <= 3.5, latencies
    for jid in ids:
        row = job(db, jid)
        assert (row["stalls"], row["suspect_stalls"], row["suspect"]) == (0, 1, False), dict(row)
    assert lost_and_duplicates(db, ids) == (0, n)  # one re-run each, nothing more
    report(f"SIGKILL with {n} jobs of 5 s, lease {lease_s:.0f} s: kill -> all running again",
           n, 0, n, latencies)


def test_a_poison_job_is_isolated_only_on_evidence(db: SyncDB, procs: Procs, settings: Settings,
                                                   report: Any) -> None:
    """One job kills its consumer on every run, among 7 healthy ones that take
    2 s on every run. The healthy ones are never charged and re-run at most
    max_stalls + 2 times; the poison fails as a job of death."""
    max_stalls = 2
    set_queue(db, "work", lease_s=30, vanished_grace_s=1, max_stalls=max_stalls,
              stall_cooldown_s=0.1)
    procs.reaper()
    first = procs.consumer("--concurrency", "8")
    first.worker_id()
    healthy = publish(settings, "work", [{"sleep": 2} for _ in range(7)])
    wait_until(lambda: _running(db, healthy, 1) == 7, 10, "7 healthy running")
    (poison,) = publish(settings, "work", [{"kill_on_attempt": 99}])
    fleet = [first]
    started = time.monotonic()
    while job(db, poison)["status"] != "failed" or lost_and_duplicates(db, healthy)[0]:
        assert time.monotonic() < started + 90, dict(job(db, poison))
        fleet = [c for c in fleet if c.alive()]
        while len(fleet) < 2:  # an orchestrator restarts what died
            fleet.append(procs.consumer("--concurrency", "8"))
        time.sleep(0.05)
    took = time.monotonic() - started
    row = job(db, poison)
    assert row["stalls"] == max_stalls + 1 and "job of death" in row["last_error"]
    for jid in healthy:
        h = job(db, jid)
        assert h["status"] == "completed" and h["stalls"] == 0, dict(h)
        runs_ = db.val("SELECT count(*) FROM test_run WHERE job_id = $1", jid)
        assert runs_ - 1 <= max_stalls + 2, (runs_, dict(h))
    lost, dups = lost_and_duplicates(db, healthy)
    report(f"poison among 7 healthy (2 s each, concurrency 8): poison failed in {took:.1f} s",
           8, lost, dups)


def test_an_isolated_suspect_leaves_the_other_slots_working(db: SyncDB, procs: Procs,
                                                            settings: Settings) -> None:
    """A suspect runs isolated, but its worker keeps running other jobs
    beside it: never one slot for the whole worker."""
    set_queue(db, "work", lease_s=30)
    procs.reaper()
    (suspect,) = publish(settings, "work", [{"sleep": 3}])
    # Mark it as a job present at two crashes, as requeue_lapsed would
    # (no consumer runs yet, so its message waits in the queue).
    db.execute("UPDATE jobq.job SET suspect = true, suspect_stalls = 2 WHERE id = $1", suspect)
    consumer = procs.consumer("--concurrency", "4")
    consumer.worker_id()
    wait_until(lambda: job(db, suspect)["isolated"], 10, "the suspect isolated")
    others = publish(settings, "work", [{"sleep": 0.5} for _ in range(6)])
    wait_until(lambda: lost_and_duplicates(db, others)[0] == 0, 10, "the others completed")
    # All six ran and finished while the suspect was still running.
    s_run = db.fetchrow("SELECT started_at FROM test_run WHERE job_id = $1", suspect)
    assert job(db, suspect)["status"] == "active"
    assert db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1) AND started_at > $2",
                  others, s_run["started_at"]) == 6
    events = [r["event"] for r in db.fetch(
        "SELECT event FROM jobq.history WHERE job_id = $1 ORDER BY at, n", suspect)]
    assert "isolated" in events
    wait_until(lambda: job(db, suspect)["status"] == "completed", 10, "the suspect completed")


def test_sigstop_of_a_worker_holding_several_jobs_charges_none(db: SyncDB, procs: Procs,
                                                               settings: Settings) -> None:
    """A frozen worker's leases lapse together (one renewal statement gave
    them one deadline): its jobs are witnesses, not charged."""
    set_queue(db, "work", lease_s=2, vanished_grace_s=2)
    procs.reaper()
    a = procs.consumer("--concurrency", "4")
    a.worker_id()
    ids = publish(settings, "work", [{"sleep": 4} for _ in range(4)])
    wait_until(lambda: _running(db, ids, 1) == 4, 10, "4 running in A")
    time.sleep(1)  # at least one renewal, so the four share a deadline
    a.signal(signal.SIGSTOP)
    procs.consumer("--concurrency", "4").worker_id()
    wait_until(lambda: lost_and_duplicates(db, ids)[0] == 0, 20, "all completed elsewhere")
    a.signal(signal.SIGCONT)
    assert db.val("SELECT max(stalls) FROM jobq.job WHERE id = ANY($1)", ids) == 0
