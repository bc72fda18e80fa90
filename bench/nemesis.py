"""A randomized fault schedule against the real services, Jepsen's shape
(issue #36), and a checker of the whole history.

For --seconds, seeded: SIGKILL (then a restart) or SIGSTOP+SIGCONT of
consumers and reapers, terminations of jobq's PostgreSQL backends, a network
cut of one consumer (its own network namespace, both links down for up to
twice the lease; as root), and with --restarts a RabbitMQ or PostgreSQL
restart (at most once a minute each), while a producer publishes single
jobs, batches (half of them bulk, ``relay=True``: the reapers publish their
ids), delayed jobs, keyed jobs (a per-key cap), jobs of a queue
with a fleet-wide cap (max_running 2, priority aging 1 s) and dependants (a job published
``after`` another), and a schedule fires every second. Two hostile
producer logins (hostile.py) hold dependency transactions open past the
lease, storm debounced keys, write unreadable trace records, cancel a
1,000-long chain mid-run and send payloads nested 985 deep to a
``--pool process`` consumer. Every handler run is a row of test_run (job,
worker, token, start, end, how it ended). Then the faults stop and the
checker reads everything:

- lost: jobs not completed within (lease + 10 s) of the last fault, plus drain;
- completions by a non-owner (a completed row whose token is no run's), and
  completed twice (two runs that returned with the row's final token);
- overlapping runs (a frozen worker's handler resumes until its fence:
  reported, not a loss; a SIGKILLed run has no recorded end);
- dependants started before a job they wait for completed;
- schedule slots fired twice; stalls charged; hostile.py's own counts.

    .venv/bin/python bench/nemesis.py --seconds 60 [--seed N]   # prints the seed
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg
from benchenv import ADMIN_URL, scratch
from hostile import FAILURES as HOSTILE_FAILURES
from hostile import Hostile
from hostile import report as hostile_report

from harness import netns
from harness.helpers import Proc, Procs, SyncDB, set_queue
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.ops.schedule_admin import set_schedule
from jobq.reaper.audit import Audit
from jobq.reaper.store import PgAuditStore
from jobq.schedules import Schedule
from jobq.settings import Settings

LEASE_S = 2.0
FAULTS = ("kill_consumer", "stop_consumer", "kill_reaper", "stop_reaper", "kill_backends",
          "cut_consumer")
# --restarts: the shared local servers themselves (never in the suite, whose
# other tests use them): a RabbitMQ restart and a PostgreSQL restart.
RESTARTS = ("restart_rabbitmq", "restart_postgres")


def restart(fault: str) -> None:
    if fault == "restart_rabbitmq":
        for cmd in (["stop_app"], ["start_app"], ["await_startup"]):
            subprocess.run(["rabbitmqctl", *cmd], check=True, capture_output=True, timeout=120)
    else:
        version = sorted(os.listdir("/etc/postgresql"))[-1]
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main",
                        "restart"], check=True, capture_output=True, timeout=120)


def producer(settings: Settings, stop: threading.Event, rng: random.Random,
             published: list[Any]) -> None:
    """Single jobs, batches of 10 (half of them with relay=True), delayed jobs,
    jobs with a deadline, keyed and limited jobs, dependants, until stopped."""
    async def go() -> None:
        async with Client(settings) as client:
            n = 0
            while not stop.is_set():
                kind = rng.random()
                sleep = round(rng.uniform(0.05, 0.5), 2)
                relay = False
                try:
                    if kind < 0.4:
                        jobs = [NewJob("work", {"sleep": sleep})]
                    elif kind < 0.55:  # half of them bulk: the reapers' relay publishes them
                        jobs = [NewJob("work", {"sleep": sleep}) for _ in range(10)]
                        relay = kind >= 0.475
                    elif kind < 0.65:
                        jobs = [NewJob("work", {"sleep": sleep}, delay_s=rng.uniform(0.5, 3))]
                    elif kind < 0.7:  # a deadline (issue #51.7): started by then or expired
                        jobs = [NewJob("work", {"sleep": sleep},
                                       expires_in_s=rng.uniform(0.1, 2))]
                    elif kind < 0.72:
                        jobs = [NewJob("fair", {"sleep": sleep}, key=f"k{n % 3}")]
                    elif kind < 0.74:  # a key held while its job is live (issue #51.4)
                        jobs = [NewJob("work", {"sleep": sleep}, idempotency_key=f"u{n % 2}",
                                       idempotency_while_live=True)]
                    elif kind < 0.78:  # capped, with priority aging (issue #51.6)
                        jobs = [NewJob("limited", {"sleep": sleep},
                                       priority=rng.choice((0, 0, 5, 9)))]
                    elif kind < 0.82:  # key policies (issue #51)
                        jobs = [NewJob(rng.choice(("ordered", "newest", "single")),
                                       {"sleep": sleep}, key=f"p{n % 2}")]
                    elif kind < 0.9:  # suspension (issue #52): a sleep, children, a signal
                        way = rng.random()
                        if way < 0.35:
                            jobs = [NewJob("waits", {"sleep_s": sleep})]
                        elif way < 0.6:  # 3 children, each tagged: spawned twice shows
                            jobs = [NewJob("waits", {"spawn": 3, "children": [
                                {"sleep": sleep, "tag": f"{n}-{i}"} for i in range(3)]})]
                        else:
                            (waiter,) = await client.publish_many(
                                [NewJob("waits", {"signal": "go", "timeout_s": 3})])
                            published.append(waiter)
                            if rng.random() < 0.7:  # else its timeout wakes it
                                await asyncio.sleep(rng.uniform(0, 0.5))
                                await client.signal(waiter, "go", n)
                            jobs = []
                    else:  # a parent, then a job that runs once it completed
                        (parent,) = await client.publish_many([NewJob("work", {"sleep": sleep})])
                        published.append(parent)
                        jobs = [NewJob("other", {"sleep": sleep}, after=[parent])]
                    published.extend(await client.publish_many(jobs, relay=relay))
                except Exception as exc:  # a backend killed under the publish: raised to us
                    print(f"  publish refused ({type(exc).__name__}); publishing on", flush=True)
                n += 1
                await asyncio.sleep(0.05)

    asyncio.run(go())


def run(seconds: float, seed: int, consumers: int, reapers: int,
        restarts: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    kinds = FAULTS + RESTARTS if restarts else FAULTS
    with scratch(QUEUES) as (db_url, amqp_url, namespace):
        db = SyncDB(db_url)
        for q in QUEUES:
            set_queue(db, q, lease_s=LEASE_S, max_stalls=1000, stall_cooldown_s=0.1)
        set_queue(db, "fair", max_running_per_key=2)
        # a per-key tier (#51.5): k0 runs 3 at a time where k1 and k2 run 2
        db.execute("INSERT INTO jobq.key_limit (queue, key, max_running) VALUES ('fair', 'k0', 3)")
        set_queue(db, "limited", max_running=2, priority_aging_s=1)
        set_queue(db, "ordered", key_policy="fifo")
        set_queue(db, "newest", key_policy="latest")
        set_queue(db, "single", key_policy="singleton")
        asyncio.run(_every_second(db_url))
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
        env.update({"JOBQ_DATABASE_URL": db_url, "JOBQ_AMQP_URL": amqp_url,
                    "JOBQ_NAMESPACE": namespace, "JOBQ_AMQP_HEARTBEAT_S": "2",
                    "JOBQ_LOG_LEVEL": "INFO", "HARNESS_DATABASE_URL": db_url,
                    "JOBQ_REAPER__MAX_SLEEP_S": "0.2",
                    "PYTHONPATH": str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")})
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-nemesis-")))
        host = netns.Host() if netns.available() is None else None
        try:
            return _schedule(db, procs, host, db_url, amqp_url, namespace, kinds, rng, seconds,
                             seed, consumers, reapers)
        finally:  # also when a fault raised: no process and no namespace left behind
            procs.close()
            if host is not None:
                host.close()
            db.close()


def _schedule(db: SyncDB, procs: Procs, host: netns.Host | None, db_url: str, amqp_url: str,
              namespace: str, kinds: tuple[str, ...], rng: random.Random, seconds: float,
              seed: int, consumers: int, reapers: int) -> dict[str, Any]:
    """The fleet, the producer and the faults for ``seconds``, then the checker."""
    fleet: list[Proc] = [procs.consumer("--concurrency", "8") for _ in range(consumers)]
    if host is not None:
        _cut_consumer(procs, host, db_url, amqp_url)
    else:
        kinds = tuple(k for k in kinds if k != "cut_consumer")  # not root: no namespaces
    reaper_fleet: list[Proc] = [procs.reaper() for _ in range(reapers)]
    for c in fleet:
        c.worker_id()
    procs.consumer("--queue", "big", "--pool", "process", "--concurrency", "2").worker_id()
    settings = Settings(database_url=db_url, amqp_url=amqp_url, namespace=namespace)
    stop = threading.Event()
    published: list[Any] = []
    feeder = threading.Thread(target=producer, args=(settings, stop, rng, published))
    feeder.start()
    hostile = Hostile(ADMIN_URL, db_url)
    mischief = threading.Thread(target=hostile.run,
                                args=(db_url, stop, random.Random(rng.random())))
    mischief.start()
    counts = dict.fromkeys(kinds, 0)
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            time.sleep(rng.uniform(0.5, 2.0))
            fault = rng.choice(kinds)
            if fault in RESTARTS and counts[fault] * 60 > time.monotonic() - started:
                fault = "kill_consumer"  # a restart a minute at most: they are slow
            counts[fault] += 1
            if fault in RESTARTS:
                restart(fault)
            elif fault == "kill_consumer":
                fleet.pop(rng.randrange(len(fleet))).kill()
                fleet.append(procs.consumer("--concurrency", "8"))
            elif fault == "kill_reaper":
                reaper_fleet.pop(rng.randrange(len(reaper_fleet))).kill()
                reaper_fleet.append(procs.reaper())
            elif fault == "cut_consumer":
                assert host is not None
                host.cut("db", "mq")
                time.sleep(rng.uniform(0.5, LEASE_S * 2))
                host.heal("db", "mq")
            elif fault in ("stop_consumer", "stop_reaper"):
                victim = rng.choice(fleet if fault == "stop_consumer" else reaper_fleet)
                victim.signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, LEASE_S * 2))
                victim.signal(signal.SIGCONT)
            else:
                db.val("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                       "AND application_name LIKE 'jobq-%' AND random() < 0.5")
        last_fault = db.val("SELECT now()")
    finally:
        stop.set()
        feeder.join(60)
        mischief.join(60)
    # The schedule stops too: its next slot, fired between the drain's last
    # look and the checker's, was once counted as lost (seed 305: every job
    # completed, then a tick fired 10 ms before the count).
    db.execute("UPDATE jobq.schedule SET enabled = false")
    deadline = time.monotonic() + LEASE_S + 10 + 60  # + drain of what is queued
    while time.monotonic() < deadline and db.val(
            "SELECT count(*) FROM jobq.job WHERE status NOT IN ('completed', 'cancelled', "
            "'failed')"):
        time.sleep(0.2)
    report = check(db, published, last_fault)
    report.update(hostile_report(db, hostile))
    hostile.close()
    report.update({"seed": seed, "seconds": seconds, "faults": counts})
    return report


# chain: cancelled mid-run by design; big: deep payloads may fail with the reason
QUEUES = ("work", "fair", "limited", "other", "prio", "chain", "big", "ordered", "newest",
          "single", "waits")


async def _every_second(db_url: str) -> None:
    """A schedule on queue prio, every second (fired by the reapers)."""
    conn = await asyncpg.connect(db_url)
    try:
        await set_schedule(conn, Schedule("tick", "prio", {"sleep": 0.05}, every_s=1.0))
    finally:
        await conn.close()


def _cut_consumer(procs: Procs, host: netns.Host, db_url: str, amqp_url: str) -> Proc:
    """A consumer whose links to both servers the schedule can cut."""
    there = {"JOBQ_DATABASE_URL": host.forward("db", db_url),
             "JOBQ_AMQP_URL": host.forward("mq", amqp_url)}
    proc = procs.consumer("--concurrency", "8", wrap=host.argv, environ=there)
    proc.worker_id()
    return proc


# What must be 0 for a run to pass (the rest is reported).
FAILURES = ("lost", "not_in_db", "completed_by_non_owner", "completed_twice",
            "dependants_started_early", "schedule_slots_twice", "fifo_out_of_order",
            "singleton_two_live", "superseded_completed", "waits_unfinished",
            "expired_ran_late", "expired_but_ran", "unique_two_live", "invariant_violations",
            "woken_twice", "children_spawned_twice")


def audited(db: SyncDB) -> int:
    """The invariant monitor's verdict (issue #50.8): what the reapers found
    live, plus a check of the whole history now (as jobq audit runs it)."""
    db.loop.run_until_complete(Audit(60.0).check(PgAuditStore(db.conn), until_done=True,
                                                 quiet=True))
    for r in db.fetch("SELECT kind, job_id, queue, detail FROM jobq.invariant_violation "
                      "ORDER BY detected_at LIMIT 10"):
        print(f"  violation: {r['kind']} {r['job_id']} ({r['queue']}): {r['detail']}")
    return int(db.val("SELECT count(*) FROM jobq.invariant_violation"))


def check(db: SyncDB, published: list[Any], last_fault: Any) -> dict[str, Any]:
    return {
        "invariant_violations": audited(db),
        "jobs": db.val("SELECT count(*) FROM jobq.job"),
        "published_ids_returned": len(published),
        "lost": db.val("SELECT count(*) FROM jobq.job WHERE status <> 'completed' "
                       "AND queue NOT IN ('chain', 'big') AND NOT (status = 'cancelled' "
                       "AND last_error LIKE 'superseded by job %') AND NOT (status = "
                       "'cancelled' AND last_error LIKE 'expired%')"),
        "not_in_db": db.val("SELECT count(*) FROM unnest($1::uuid[]) p(id) WHERE NOT EXISTS "
                            "(SELECT 1 FROM jobq.job j WHERE j.id = p.id)", published),
        "completed_by_non_owner": db.val(  # (big's handler records no run: hostile.py)
            "SELECT count(*) FROM jobq.job j WHERE status = 'completed' AND queue <> 'big' "
            "AND NOT EXISTS (SELECT 1 FROM test_run r WHERE r.job_id = j.id "
            "AND r.lock = j.lock)"),
        "completed_twice": db.val(
            "SELECT count(*) FROM (SELECT j.id FROM jobq.job j JOIN test_run r "
            "ON r.job_id = j.id AND r.lock = j.lock AND r.outcome = 'returned' "
            "GROUP BY j.id HAVING count(*) > 1) t"),
        "overlapping_runs": db.val(
            "SELECT count(*) FROM test_run a JOIN test_run b ON a.job_id = b.job_id "
            "AND a.n < b.n AND b.started_at < a.ended_at"),  # a SIGKILLed run has no end
        "reruns": db.val("SELECT count(*) FROM test_run") - db.val(
            "SELECT count(*) FROM jobq.job"),
        "dependants_started_early": db.val(
            "SELECT count(*) FROM jobq.job_dependency d JOIN jobq.job p ON p.id = d.parent_id "
            "JOIN test_run r ON r.job_id = d.job_id "
            "WHERE p.finished_at IS NULL OR r.started_at < p.finished_at"),
        "dependants": db.val("SELECT count(*) FROM jobq.job_dependency"),
        "schedule_slots_fired": db.val("SELECT count(*) FROM jobq.job WHERE queue = 'prio'"),
        "schedule_slots_twice": db.val(
            "SELECT count(*) FROM (SELECT idempotency_key FROM jobq.job WHERE queue = 'prio' "
            "GROUP BY idempotency_key HAVING count(*) > 1) t"),
        "stalls_charged": db.val("SELECT coalesce(sum(stalls), 0) FROM jobq.job"),
        # key policies (issue #51): a fifo job's run started before an earlier
        # job of its key ended; a singleton job made while another of its key
        # was live; a latest job completed though a newer one of its key was
        # made before its completion
        "fifo_out_of_order": db.val(
            "SELECT count(*) FROM jobq.job a JOIN jobq.job b ON b.queue = a.queue "
            "AND b.key = a.key AND b.seq > a.seq JOIN test_run r ON r.job_id = b.id "
            "WHERE a.key_policy = 'fifo' AND (a.finished_at IS NULL "
            "OR r.started_at < a.finished_at)"),
        "singleton_two_live": db.val(
            "SELECT count(*) FROM jobq.job a JOIN jobq.job b ON b.queue = a.queue "
            "AND b.key = a.key AND b.id <> a.id AND b.created_at > a.created_at "
            "WHERE a.key_policy = 'singleton' AND b.key_policy = 'singleton' "
            "AND (a.finished_at IS NULL OR b.created_at < a.finished_at)"),
        "superseded_completed": db.val(
            "SELECT count(*) FROM jobq.job a WHERE a.key_policy = 'latest' "
            "AND a.status = 'completed' AND EXISTS (SELECT 1 FROM jobq.job b "
            "WHERE b.queue = a.queue AND b.key = a.key AND b.seq > a.seq "
            "AND b.created_at < a.finished_at)"),
        "superseded": db.val("SELECT count(*) FROM jobq.job WHERE last_error LIKE "
                             "'superseded by job %'"),
        # suspension (issue #52): every waiting job ended (a signal or its
        # timeout), none woken into a second live run
        "waits_unfinished": db.val("SELECT count(*) FROM jobq.job WHERE queue = 'waits' "
                                   "AND status <> 'completed'"),
        "suspended_runs": db.val("SELECT count(*) FROM test_run r JOIN jobq.job j "
                                 "ON j.id = r.job_id WHERE j.queue = 'waits' "
                                 "AND r.outcome = 'suspended'"),
        # a wake per suspension at most (a signal's or the children's), and one
        # child per spawn name however often its parent ran
        "woken_twice": db.val(
            "SELECT count(*) FROM (SELECT job_id FROM jobq.job_event GROUP BY job_id "
            "HAVING count(*) FILTER (WHERE event = 'woken') "
            "> count(*) FILTER (WHERE event = 'suspended')) t"),
        "children_spawned": db.val("SELECT count(*) FROM jobq.job WHERE payload ? 'tag'"),
        "children_spawned_twice": db.val(
            "SELECT count(*) FROM (SELECT payload->>'tag' FROM jobq.job WHERE payload ? 'tag' "
            "GROUP BY 1 HAVING count(*) > 1) t") + db.val(
            "SELECT count(*) FROM (SELECT s.job_id FROM jobq.job_step s "
            "WHERE s.name LIKE 'spawn:%' GROUP BY 1 HAVING count(*) <> 3) t"),
        # deadlines (issue #51.7): no job's first claim was past its deadline;
        # no job cancelled as expired had ever run
        "with_deadline": db.val("SELECT count(*) FROM jobq.job WHERE expires_at IS NOT NULL"),
        "expired": db.val("SELECT count(*) FROM jobq.job WHERE last_error LIKE 'expired%'"),
        "expired_ran_late": db.val(
            "SELECT count(*) FROM jobq.job j WHERE j.expires_at IS NOT NULL AND "
            "(SELECT min(e.at) FROM jobq.job_event e WHERE e.job_id = j.id "
            "AND e.event = 'claimed') > j.expires_at"),  # the claim's clock, not the handler's
        "expired_but_ran": db.val(
            "SELECT count(*) FROM jobq.job j WHERE j.last_error LIKE 'expired%' "
            "AND EXISTS (SELECT 1 FROM test_run r WHERE r.job_id = j.id)"),
        # a key held while live (issue #51.4): no job made with it while another
        # job holding it was queued or running (created_at is its transaction's
        # start, which may come a moment before the read that saw the holder end)
        "unique_live_jobs": db.val("SELECT count(*) FROM jobq.job "
                                   "WHERE idempotency_scope = 'live'"),
        "unique_two_live": db.val(
            "SELECT count(*) FROM jobq.job a JOIN jobq.job b ON b.queue = a.queue "
            "AND b.idempotency_key = a.idempotency_key AND b.id <> a.id "
            "AND b.created_at > a.created_at WHERE a.idempotency_scope = 'live' "
            "AND b.idempotency_scope = 'live' "
            "AND (a.finished_at IS NULL OR b.created_at < a.finished_at - interval '200 ms')"),
        "terminal_after_last_fault_s": db.val(
            "SELECT round(extract(epoch FROM max(finished_at) - $1::timestamptz)::numeric, 2) "
            "FROM jobq.job", last_fault),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--reapers", type=int, default=2)
    ap.add_argument("--restarts", action="store_true",
                    help="also restart the local RabbitMQ and PostgreSQL (at most once a "
                    "minute each); never while anything else uses them")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    print(f"nemesis: seed {seed}, {args.seconds:g} s of faults, lease {LEASE_S:g} s",
          flush=True)
    report = run(args.seconds, seed, args.consumers, args.reapers, args.restarts)
    width = max(len(k) for k in report)
    for k, v in report.items():
        print(f"  {k:<{width}}  {v}")
    bad = any(report[k] for k in FAILURES + HOSTILE_FAILURES)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
