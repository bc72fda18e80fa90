"""Network partitions (issue #15): a service on a host of its own (a network
namespace, harness/netns.py) whose link is cut without closing its TCP
connections, then healed.

- A consumer cut off from everything stops its handlers before its leases
  lapse (self-fencing, by the timestamps of its log and the reaper's), its
  jobs run again elsewhere after lease + slack, and once healed it can
  neither renew nor complete them.
- A reaper cut off: the other reaper carries on; once healed, it requeues
  nothing a second time.
- A consumer cut off from RabbitMQ only: the database is still reachable, so
  its running jobs keep their leases and finish there; the ids it had
  prefetched run once each (from its buffer while the database link holds,
  or elsewhere once the broker requeues them).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, as_role, job, publish, runs, set_queue, wait_until
from harness.netns import Host, available
from jobq.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=str(available()))]

LEASE_S = 2.0
HEARTBEAT_S = 2  # JOBQ_AMQP_HEARTBEAT_S of the test services (tests/conftest.py)


@pytest.fixture
def host(procs: Any) -> Iterator[Host]:
    h = Host()
    yield h
    procs.close()  # the namespace's processes end before it goes
    h.close()


def elsewhere(procs: Any, host: Host, verb: str, *extra: str, **env: str) -> Any:
    """A jobq service on ``host``, as its role's login, through the links."""
    role_env = as_role(procs.env, [verb])
    return procs.start(verb, *extra, wrap=host.argv,
                       JOBQ_DATABASE_URL=host.forward("db", role_env["JOBQ_DATABASE_URL"]),
                       JOBQ_AMQP_URL=host.forward("mq", role_env["JOBQ_AMQP_URL"]), **env)


def at(log: str, pattern: str) -> datetime:
    m = re.search(rf"^(\S+) .*{pattern}", log, re.MULTILINE)
    assert m, f"no {pattern!r} in the log"
    return datetime.strptime(m.group(1)[:23], "%Y-%m-%dT%H:%M:%S.%f")


def test_a_consumer_cut_off_fences_itself_and_cannot_finish_after_healing(db: SyncDB, procs: Procs,
                                                                          settings: Settings,
                                                                          host: Host) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    a = elsewhere(procs, host, "consume", "harness.apps:app", "--concurrency", "8")
    a_id = a.worker_id()
    reaper = procs.reaper()
    # Re-runs as long. 8 s, not 3: B starts after A runs them, and on a slow
    # machine B's start outlasted 3 s jobs, which A then finished before the cut.
    ids = publish(settings, "work", [{"sleep": 8} for _ in range(6)])
    # Running, not only claimed: each handler has logged its start (through A's link).
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1) AND "
                              "worker = $2", ids, a_id) == 6, 10, "A running the 6 jobs")
    # B is up before the cut (as in test_pgbouncer), so the bound below times
    # the recovery, not a Python start on a loaded machine.
    b = procs.consumer("--concurrency", "8")
    b_id = b.worker_id()
    cut_at = db.val("SELECT now()")
    host.cut()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                              "status = 'completed'", ids) == 6, 30, "B completing the 6")
    again = [runs(db, j)[1]["started_at"] for j in ids]
    back = max((t - cut_at).total_seconds() for t in again)
    print(f"partitioned consumer: its 6 jobs ran again {back:.2f} s after the cut "
          f"(lease {LEASE_S} s, AMQP heartbeat {HEARTBEAT_S} s)")
    # lease + slack: an id republished to the cut consumer (the broker still
    # thinks it alive) waits until the broker misses two heartbeats.
    assert back < LEASE_S + 2 * HEARTBEAT_S + 2
    for j in ids:  # A stopped each handler before its lease lapsed
        assert at(a.log(), rf"event=lease_lost job={j}") < at(reaper.log(),
                                                             rf"event=stalled job={j}")
    host.heal()
    time.sleep(LEASE_S + 1)  # A's renewals and completions get through again, fenced
    assert all(job(db, j)["worker_id"] == b_id for j in ids)
    assert not re.search(r"event=completed job=", a.log())
    assert db.val("SELECT count(*) FROM jobq.history WHERE job_id = ANY($1) "
                  "AND event = 'completed' AND worker_id = $2", ids, b_id) == 6
    assert a.alive()


def test_a_reaper_cut_off_requeues_nothing_twice_after_healing(db: SyncDB, procs: Procs,
                                                               settings: Settings,
                                                               host: Host) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    r1 = elsewhere(procs, host, "reap")
    r1.wait_log("reaper ready")
    procs.reaper().wait_log("reaper ready")
    c = procs.consumer("--concurrency", "8")
    c_id = c.worker_id()
    ids = publish(settings, "work", [{"sleep": 3} for _ in range(4)])  # re-runs as long
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1) AND "
                              "worker = $2", ids, c_id) == 4, 10, "C running the 4 jobs")
    host.cut()
    c.kill()
    procs.consumer("--concurrency", "8").worker_id()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                              "status = 'completed'", ids) == 4, 20, "the 4 re-run and done")
    host.heal()
    time.sleep(3)  # r1 sweeps again
    assert [len(runs(db, j)) for j in ids] == [2, 2, 2, 2]
    requeues = db.val("SELECT count(*) FROM jobq.job_event WHERE job_id = ANY($1) "
                      "AND event IN ('stalled', 'requeued')", ids)
    assert requeues == 4, f"each lapsed lease requeued exactly once, got {requeues}"
    assert r1.alive()


def test_a_consumer_cut_off_from_the_broker_finishes_its_running_jobs(db: SyncDB, procs: Procs,
                                                                      settings: Settings,
                                                                      host: Host) -> None:
    set_queue(db, "work", lease_s=LEASE_S)
    a = elsewhere(procs, host, "consume", "harness.apps:app", "--concurrency", "2",
                  JOBQ_CONSUMER__PREFETCH="10")
    a_id = a.worker_id()
    procs.reaper()
    ids = publish(settings, "work", [{"sleep": 3} for _ in range(10)])
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                              "status = 'active' AND worker_id = $2", ids, a_id) == 2,
               10, "A running 2 jobs, 8 more in its prefetch")
    running = [r["id"] for r in db.fetch("SELECT id FROM jobq.job WHERE id = ANY($1) AND "
                                         "status = 'active'", ids)]
    host.cut("mq")
    b = procs.consumer("--concurrency", "8")
    b.worker_id()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                              "status = 'completed'", ids) == 10, 30, "all 10 completed")
    for j in running:  # kept their leases (renewed through the database link) and finished
        assert job(db, j)["worker_id"] == a_id and len(runs(db, j)) == 1
    assert all(len(runs(db, j)) == 1 for j in ids), "nothing ran twice"
    host.heal("mq")
    assert a.alive()
