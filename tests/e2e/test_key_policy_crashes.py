"""Key policies through a SIGKILL (issue #51; schema 0027): a fifo key's
head, running on a consumer that is killed, runs again before any of its
successors starts, and they then run one at a time in publish order on the
survivor; a latest key's running job, its consumer killed, is superseded
when the reapers requeue it, never run again. Real processes, database
timestamps."""

from __future__ import annotations

import itertools
import signal
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, publish_jobs, set_queue, wait_until
from jobq.newjob import NewJob
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def _kill_holder(db: SyncDB, procs: list[Any], jid: Any) -> None:
    """SIGKILL the consumer running ``jid`` once its handler started (its
    test_run row); the other one survives."""
    wid = wait_until(lambda: db.val("SELECT r.worker FROM test_run r JOIN jobq.job j ON "
                                    "j.id = r.job_id AND j.status = 'active' "
                                    "WHERE r.job_id = $1", jid), 15, "the handler running")
    victim = next(c for c in procs if c.worker_id() == wid)
    victim.signal(signal.SIGKILL)


def test_a_killed_fifo_head_runs_again_before_its_successors(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    set_queue(db, "fair", lease_s=2, key_policy="fifo")
    procs.reaper()
    consumers = [procs.consumer("--queue", "fair", "--concurrency", "4") for _ in range(2)]
    for c in consumers:
        c.worker_id()
    ids = publish_jobs(settings, [NewJob("fair", {"sleep": 1.0 if i == 0 else 0.05}, key="k")
                              for i in range(4)])
    _kill_holder(db, consumers, ids[0])
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                              "status = 'completed'", ids) == 4, 60, "all four")
    runs = db.fetch("SELECT job_id, started_at, ended_at FROM test_run WHERE job_id = ANY($1) "
                    "ORDER BY started_at", ids)
    assert [r["job_id"] for r in runs] == [ids[0], *ids], runs  # the head twice, first
    for a, b in itertools.pairwise(runs[1:]):  # the killed run has no end
        assert a["ended_at"] <= b["started_at"], f"runs of one key overlapped: {a} {b}"


def test_a_superseded_latest_job_on_a_killed_consumer_never_runs_again(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    set_queue(db, "other", lease_s=2, key_policy="latest")
    procs.reaper()
    consumers = [procs.consumer("--queue", "other", "--concurrency", "4") for _ in range(2)]
    for c in consumers:
        c.worker_id()
    (old,) = publish_jobs(settings, [NewJob("other", {"sleep": 30}, key="k")])
    _kill_holder(db, consumers, old)
    (new,) = publish_jobs(settings, [NewJob("other", {}, key="k")])
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", new) == "completed",
               30, "the newer job")
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", old) == "cancelled",
               30, "the older job superseded")
    assert db.val("SELECT count(*) FROM test_run WHERE job_id = $1", old) == 1
