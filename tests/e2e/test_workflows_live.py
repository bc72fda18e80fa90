"""Workflows (issue #31) with real consumers and reapers killed under them:
a fan-in callback starts exactly once, after all of its 200 parents, while a
consumer is SIGKILLed every 2 s; a chain re-runs its killed middle step and
the last step sees that re-run's result; durable steps of a job killed after
its second step are not run again. Read from the database and from the
handlers' own records (test_run, test_counter)."""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import time
from typing import Any

from harness.helpers import Procs, SyncDB, set_queue, wait_until
from jobq.client.producer import Client
from jobq.client.workflow import Workflow
from jobq.newjob import NewJob
from jobq.settings import Settings


def _publish(settings: Settings, wf: Workflow) -> Any:
    async def go() -> Any:
        async with Client(settings) as client:
            return await client.publish_workflow(wf)

    return asyncio.run(go())


def test_a_fan_in_starts_once_after_all_200_while_consumers_die(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    for q in ("wf", "wf_callback"):
        set_queue(db, q, lease_s=30)
    for _ in range(2):
        procs.reaper()
    live = [procs.consumer("--queue", "wf", "--queue", "wf_callback", "--concurrency", "8")
            for _ in range(3)]
    for c in live:
        c.worker_id()
    rng = random.Random(31)
    wf = Workflow()
    parents = [wf.step("wf", {"sleep": round(rng.uniform(0.2, 1.0), 2)}) for _ in range(200)]
    callback = wf.step("wf_callback", {}, after=parents)
    _publish(settings, wf)
    ids = [p.id for p in parents]
    kills = 0
    stop = threading.Event()
    own = SyncDB(db.url)

    def killer() -> None:  # every 2 s, one consumer dies and another starts
        nonlocal kills
        while not stop.wait(2.0):
            if own.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status = "
                       "'completed'", ids) >= 190:
                return
            victim = live.pop(rng.randrange(len(live)))
            victim.signal(signal.SIGKILL)
            kills += 1
            live.append(procs.consumer("--queue", "wf", "--queue", "wf_callback",
                                       "--concurrency", "8"))

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", callback.id)
                   == "completed", 90, "the callback")
    finally:
        stop.set()
        t.join(10)
        own.close()
    last_parent = db.val("SELECT max(finished_at) FROM jobq.job WHERE id = ANY($1)", ids)
    runs = db.fetch("SELECT started_at FROM test_run WHERE job_id = $1", callback.id)
    after_s = (runs[0]["started_at"] - last_parent).total_seconds()
    result = db.val("SELECT result->>'parents' FROM jobq.job WHERE id = $1", callback.id)
    done = db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status = 'completed'",
                  ids)
    print(f"fan-in of 200 under {kills} SIGKILLs: {done} parents completed; the callback "
          f"started {len(runs)} time(s), {after_s:.3f} s after the last parent, and saw "
          f"{result} parents' results")
    assert kills >= 2, "no consumer was killed during the fan-out"
    assert done == 200 and len(runs) == 1
    assert 0 <= after_s < 3.0 and result == "200"


def test_a_chain_reruns_its_killed_middle_and_the_end_sees_the_rerun(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    for q in ("wf", "wf_callback"):
        set_queue(db, q, lease_s=30)
    procs.reaper()
    consumers = [procs.consumer("--queue", "wf", "--queue", "wf_callback") for _ in range(2)]
    workers = {c.worker_id(): c for c in consumers}
    wf = Workflow()
    a = wf.step("wf", {"sleep": 0.2})
    b = wf.step("wf", {"sleep": 3}, after=[a])
    c = wf.step("wf_callback", {}, after=[b])
    _publish(settings, wf)
    holder = wait_until(lambda: db.val("SELECT worker_id FROM jobq.job WHERE id = $1 AND "
                                       "status = 'active'", b.id), 20, "B running")
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = $1", b.id), 10,
               "B's handler started")
    workers[holder].signal(signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = $1", b.id) == 2,
               15, "B's re-run")
    rerun_s = time.monotonic() - killed
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", c.id) == "completed",
               20, "C")
    c_runs = db.val("SELECT count(*) FROM test_run WHERE job_id = $1", c.id)
    seen = db.val("SELECT result->'attempts'->>0 FROM jobq.job WHERE id = $1", c.id)
    print(f"chain A -> B -> C, B's consumer SIGKILLed: B ran again {rerun_s:.2f} s later; C "
          f"ran {c_runs} time(s) and saw B's attempt {seen}")
    assert rerun_s < 3.0 and c_runs == 1 and seen == "2"


def test_durable_steps_are_not_run_again_after_a_sigkill(
        db: SyncDB, procs: Procs, settings: Settings) -> None:
    set_queue(db, "steps", lease_s=30)
    procs.reaper()
    for _ in range(2):
        procs.consumer("--queue", "steps").worker_id()

    async def go() -> Any:
        async with Client(settings) as client:
            return await client.publish_many([NewJob("steps", {"kill_after_step": 2})])

    (jid,) = asyncio.run(go())
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "completed",
               20, "the job after its re-run")
    counters = {r["name"].split(":")[1]: r["n"] for r in db.fetch(
        "SELECT name, n FROM test_counter WHERE name LIKE $1", f"{jid}:%")}
    runs = db.val("SELECT count(*) FROM test_run WHERE job_id = $1", jid)
    steps = [r["name"] for r in db.fetch("SELECT name FROM jobq.job_step WHERE job_id = $1 "
                                         "ORDER BY at", jid)]
    print(f"3 durable steps, killed after step 2: {runs} runs, counters {counters}, "
          f"steps recorded {steps}")
    assert runs == 2 and counters == {"one": 1, "two": 1, "three": 1}
    assert steps == ["one", "two", "three"]
