"""Per-key tiers (issue #51, item 5): one key's own limits over its queue's
per-key default, held fleet-wide by two consumers (a sampler reads the
running count per key as fast as the database answers), and given back with
a SIGKILLed consumer's leases (I9); ``jobq keys`` shows which limits apply;
bad input and a queue without per-key limits get one line."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, publish_jobs, run_cli, set_queue, wait_until
from jobq.newjob import NewJob
from jobq.settings import Settings
from tests.integration.test_cli import one_line_error

pytestmark = pytest.mark.e2e


def _done(db: SyncDB, ids: list[Any]) -> bool:
    return bool(db.val("SELECT count(*) FILTER (WHERE status <> 'completed') = 0 "
                       "FROM jobq.job WHERE id = ANY($1)", ids))


def test_a_keys_tier_holds_fleet_wide_and_survives_a_killed_consumer(
        db: SyncDB, procs: Procs, settings: Settings, env: dict[str, str]) -> None:
    set_queue(db, "fair", lease_s=30)
    one_line_error(run_cli(env, "keys", "set", "fair", "big", "--max-running", "6"), 1,
                   "has no per-key limits")
    set_queue(db, "fair", lease_s=30, max_running_per_key=2)
    out = run_cli(env, "keys", "set", "fair", "big", "--max-running", "6")
    assert out.returncode == 0, out.stderr
    listed = run_cli(env, "keys", "fair").stdout.splitlines()
    big = next(ln for ln in listed if " big " in f" {ln} ")
    assert "6" in big.split() and "True" in big.split(), listed
    procs.reaper()
    consumers = [procs.consumer("--queue", "fair", "--concurrency", "8") for _ in range(2)]
    for c in consumers:
        c.worker_id()
    peak = {"big": 0, "small": 0}
    stop = threading.Event()
    own = SyncDB(db.url)  # a SyncDB is one thread's

    def sample() -> None:
        while not stop.is_set():
            for k, n in own.fetch("SELECT key, count(*) FROM jobq.job WHERE queue = 'fair' "
                                  "AND status = 'active' AND lease_expires_at > now() "
                                  "GROUP BY key"):
                peak[k] = max(peak[k], n)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        ids = publish_jobs(settings, [NewJob("fair", {"sleep": 0.3}, key=k)
                                      for k in ("big", "small") for _ in range(40)])
        # One consumer dies holding some of big's slots: they come back with
        # its leases (its session's end cuts them), and the tier still holds.
        victim = consumers[0].worker_id()
        wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE key = 'big' AND "
                                  "status = 'active' AND worker_id = $1", victim), 20,
                   "the first consumer to hold some of big's slots")
        consumers[0].signal(signal.SIGKILL)
        wait_until(lambda: _done(db, ids), 90, "every job completed")
    finally:
        stop.set()
        sampler.join()
        own.close()
    assert peak == {"big": 6, "small": 2}, peak  # reached and never passed, per key
    # Dropped (0): big is back at the queue's default.
    assert run_cli(env, "keys", "set", "fair", "big", "--max-running", "0").returncode == 0
    assert db.val("SELECT count(*) FROM jobq.key_limit") == 0


def test_key_tier_mistakes_are_one_line(db: SyncDB, env: dict[str, str]) -> None:
    set_queue(db, "tiers2", max_running_per_key=2)
    for args, needle in ((["--max-running", "-1"], "--max-running takes"),
                         (["--rate-per-second", "nan"], "--rate-per-second takes"),
                         ([], "give --max-running")):
        one_line_error(run_cli(env, "keys", "set", "tiers2", "k", *args), 1, needle)
    one_line_error(run_cli(env, "keys", "a", "b"), 1, "use jobq keys")
    assert run_cli(env, "keys", "set", "tiers2", "k", "--rate-per-second", "3").returncode == 0
    assert db.fetchrow("SELECT max_running, rate_per_s FROM jobq.key_limit")["rate_per_s"] == 3
