"""Results and progress (issue #17): a handler's return value is stored with
its completion and reaches `client.result` / `jobq wait` through NOTIFY; a
failure is raised; a zombie's result never replaces the owner's; progress is
fenced, rate-limited and visible in jobq.running and `jobq inspect`."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest

from harness.helpers import Procs, SyncDB, publish, run_cli, set_queue, wait_until
from jobq import Client, JobFailed
from jobq.settings import Settings


def test_result_reaches_the_waiting_client_and_the_cli(
        db: SyncDB, procs: Procs, settings: Settings, env: dict[str, str]) -> None:
    procs.consumer("--queue", "results").worker_id()

    async def go() -> tuple[object, float, object]:
        async with Client(settings) as client:
            job_id = await client.publish("results", {"return": {"answer": 42}, "hold": 0.5})
            t0 = time.monotonic()
            value = await client.result(job_id, timeout=20)
            waited = time.monotonic() - t0
            failing = await client.publish("results", {"fail_now": True})
            with pytest.raises(JobFailed, match="cannot ever work"):
                await client.result(failing, timeout=20)
            with pytest.raises(TimeoutError):
                await client.result(await client.publish("results", {"hold": 5}), timeout=0.3)
            return value, waited, job_id

    value, waited, job_id = asyncio.run(go())
    assert value == {"answer": 42}
    assert 0.4 < waited < 3, waited  # woken at the end, not by a poll interval
    assert json.loads(db.val("SELECT result FROM jobq.job WHERE id = $1", job_id)) == value
    out = run_cli(env, "wait", str(job_id), "--timeout", "5")
    assert out.returncode == 0 and json.loads(out.stdout) == {"answer": 42}, out.stderr
    big = publish(settings, "results", [{"bytes": 70000}])[0]
    out = run_cli(env, "wait", str(big), "--timeout", "20")
    assert out.returncode == 1 and "over the queue's max_result_bytes" in out.stderr
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", big) == "failed"


def test_a_zombies_result_never_replaces_the_owners(db: SyncDB, procs: Procs,
                                                    settings: Settings) -> None:
    set_queue(db, "results", lease_s=1)
    a = procs.consumer("--queue", "results")
    a.worker_id()
    procs.reaper()
    (jid,) = publish(settings, "results", [{"sleep_first": 3, "return": "from whoever"}])
    wait_until(lambda: db.val("SELECT count(*) FROM test_run WHERE job_id = $1", jid) == 1, 10,
               "A to start the job")
    a.signal(signal.SIGSTOP)  # A becomes a zombie; B owns the job after the lease
    b = procs.consumer("--queue", "results")
    b.worker_id()
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "completed",
               20, "B to complete it")
    owner = db.fetchrow("SELECT result, worker_id, lock FROM jobq.job WHERE id = $1", jid)
    a.signal(signal.SIGCONT)  # A's handler wakes and returns: its completion is fenced out
    time.sleep(4)
    after = db.fetchrow("SELECT result, worker_id, lock FROM jobq.job WHERE id = $1", jid)
    assert after == owner and after["worker_id"] == b.worker_id()


def test_progress_is_fenced_rate_limited_and_visible(
        db: SyncDB, procs: Procs, settings: Settings, env: dict[str, str]) -> None:
    procs.consumer("--queue", "results").worker_id()
    steps = list(range(1, 201))  # 200 reports in ~2 s: at most ~3 writes
    (jid,) = publish(settings, "results", [{"progress": steps, "every": 0.01, "hold": 1.5}])
    seen = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        row = db.fetchrow("SELECT status, progress FROM jobq.job WHERE id = $1", jid)
        running = db.val("SELECT progress FROM jobq.running WHERE id = $1", jid)
        if running is not None:
            seen.add(json.loads(running))
        if row["status"] == "completed":
            break
        time.sleep(0.05)
    assert db.val("SELECT progress FROM jobq.job WHERE id = $1", jid) == "200"  # the last lands
    assert 1 <= len(seen) <= 5, seen  # rate-limited: about one write a second
    writes = db.val("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'job'")
    assert writes < 60, writes  # not 200 progress updates
    out = run_cli(env, "inspect", str(jid))
    assert "progress" in out.stdout and "200" in out.stdout
