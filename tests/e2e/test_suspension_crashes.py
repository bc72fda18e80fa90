"""Suspension through SIGKILLs (issue #52, DESIGN I12), real processes: a
job asleep or waiting for a signal holds nothing, so killing every consumer
while it waits changes nothing (no re-run, no stall charged); a consumer
killed while the job runs, before it suspends, costs one re-run that finds
its steps recorded; the signal, sent with ``jobq signal`` from the CLI while
no consumer runs, wakes it once. Who ran what is read from test_run."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, publish, run_cli, set_queue, wait_until

pytestmark = pytest.mark.e2e


def _outcomes(db: SyncDB, jid: Any) -> list[Any]:
    return [r["outcome"] for r in db.fetch("SELECT outcome FROM test_run WHERE job_id = $1 "
                                           "ORDER BY n", jid)]


def _suspended(db: SyncDB, jid: Any) -> bool:
    """The suspension is written: the handler's outcome is recorded when it
    raises, before the consumer's suspend statement commits (a SIGKILL in
    between leaves an active lease: CI once saw a stall and a second sleep)."""
    return bool(_outcomes(db, jid) == ["suspended"] and db.val(
        "SELECT status = 'queued' AND lease_expires_at IS NULL FROM jobq.job WHERE id = $1",
        jid))


def test_killing_every_consumer_while_jobs_wait_changes_nothing(
        db: SyncDB, procs: Procs, settings: Any, env: dict[str, str]) -> None:
    set_queue(db, "waits", lease_s=2)
    procs.reaper()
    first = procs.consumer("--queue", "waits")
    first.worker_id()
    napper, waiter = publish(settings, "waits", [{"sleep_s": 3.0}, {"signal": "approve"}])
    wait_until(lambda: _suspended(db, napper) and _suspended(db, waiter), 15, "both waiting")
    first.signal(signal.SIGKILL)
    out = run_cli(env, "signal", str(waiter), "approve", '{"ok": true}')
    assert out.returncode == 0 and "sent" in out.stdout, out.stdout + out.stderr
    again = run_cli(env, "signal", str(waiter), "approve", "1")
    assert again.returncode == 0 and "first is kept" in again.stdout, again.stdout
    unknown = run_cli(env, "signal", "00000000-0000-0000-0000-000000000001", "approve")
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1
    procs.consumer("--queue", "waits").worker_id()
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND "
                              "status = 'completed'", [napper, waiter]) == 2, 20,
               "both waiting jobs complete")
    for jid in (napper, waiter):
        assert _outcomes(db, jid) == ["suspended", "returned"], jid
        row = db.fetch("SELECT attempts, stalls, errors FROM jobq.job WHERE id = $1", jid)[0]
        assert (row["attempts"], row["stalls"], row["errors"]) == (1, 0, 0), dict(row)
    assert db.val("SELECT result->'got' FROM jobq.job WHERE id = $1", waiter) == '{"ok": true}'


def test_a_sleeping_jobs_rerun_on_another_consumer_keeps_its_steps(
        db: SyncDB, procs: Procs, settings: Any) -> None:
    set_queue(db, "waits", lease_s=2)
    procs.reaper()
    victim = procs.consumer("--queue", "waits")
    victim.worker_id()
    (jid,) = publish(settings, "waits", [{"sleep_s": 1.0}])
    wait_until(lambda: _suspended(db, jid), 15, "asleep")
    step = db.val("SELECT result FROM jobq.job_step WHERE job_id = $1 AND name = 'first'", jid)
    victim.signal(signal.SIGKILL)
    procs.consumer("--queue", "waits").worker_id()
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "completed",
               20, "the job completes")
    assert db.val("SELECT result->'first' FROM jobq.job WHERE id = $1", jid) == step


def test_a_parent_killed_right_after_spawning_leaves_each_child_once(
        db: SyncDB, procs: Procs, settings: Any) -> None:
    set_queue(db, "waits", lease_s=2)
    set_queue(db, "work", lease_s=2)
    procs.reaper()
    victim = procs.consumer("--queue", "waits")  # the children run elsewhere: none dies
    victim.worker_id()
    (parent,) = publish(settings, "waits", [{"spawn": 20, "kill_after_spawn": True,
                                             "children": [{"sleep": 0.05}]}])
    wait_until(lambda: not victim.alive(), 20, "the parent's consumer killed by its handler")
    procs.consumer("--queue", "waits", "--queue", "work").worker_id()
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", parent)
               == "completed", 40, "the parent joined its children")
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'work'") == 20
    assert db.val("SELECT count(*) FROM test_run r JOIN jobq.job j ON j.id = r.job_id "
                  "WHERE j.queue = 'work'") == 20  # each child ran once
    assert db.val("SELECT jsonb_array_length(result->'got') FROM jobq.job WHERE id = $1",
                  parent) == 20
