"""The reaper's duties and its sweep against a fake store (issue #48): which
duties a probe lets run, that each fails alone, that the relay follows what
the duties before it put back in line, that bounded duties bring the loop
straight back, and the clocks' duties (schedules, lost messages, retention).
The statements themselves are the integration tests'."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from harness.fake_reaper_store import FakeReaperStore
from jobq.errors import DatabaseUnavailable
from jobq.reaper import Reaper
from jobq.reaper.lost import republish_lost
from jobq.reaper.periodic import fire_due
from jobq.reaper.retention import prune_expired
from jobq.rows import Lapsed, Probe, Settled
from jobq.settings import Settings

NOTHING = Probe(False, False, False, False, False, None)


def sweep(store: FakeReaperStore, probe: Probe | None) -> Any:
    return asyncio.run(Reaper(Settings(), store).run_once(probe))


def lapsed(status: str = "queued") -> Lapsed:
    return Lapsed(uuid.uuid4(), "q", status, 1, 0, "own", "w1")


def test_a_probe_with_nothing_to_do_runs_no_duty() -> None:
    store = FakeReaperStore()
    done = sweep(store, NOTHING)
    assert [c for c in store.calls if c not in ("register", "record_sweep")] == []
    assert not done.errors


def test_what_the_requeue_put_back_is_relayed_in_the_same_sweep() -> None:
    store = FakeReaperStore()
    store.lapsed = [[lapsed(), lapsed("failed")]]
    done = sweep(store, Probe(True, False, False, False, False, None))
    assert len(done.requeued) == 1 and len(done.failed) == 1
    assert store.calls.index("requeue_lapsed") < store.calls.index("relay")


def test_each_duty_fails_alone_and_the_sweep_says_which() -> None:
    store = FakeReaperStore()
    store.fail_next("requeue_lapsed", RuntimeError("a row breaks the statement"))
    store.settled = Settled(3, 0, False)
    done = sweep(store, Probe(True, True, True, True, True, None, dependants=True))
    assert set(done.errors) == {"requeue"}
    for duty in ("cut_vanished", "schedules_due", "unpark", "settle", "relay"):
        assert duty in store.calls, duty
    assert store.last_failing.startswith("requeue: RuntimeError")


def test_a_sweep_where_every_duty_failed_raises_for_the_loops_backoff() -> None:
    store = FakeReaperStore()
    for name in ("cut_vanished", "requeue_lapsed", "schedules_due", "expire_due",
                 "supersede_pending", "unpark",
                 "wake_signalled", "settle", "relay"):
        store.fail_next(name, DatabaseUnavailable("away"))
    with pytest.raises(DatabaseUnavailable):
        sweep(store, None)


def test_a_bounded_dependants_duty_with_more_left_brings_the_loop_straight_back() -> None:
    store = FakeReaperStore()
    store.settled = Settled(1000, 0, True)
    done = sweep(store, Probe(False, False, False, False, False, None, dependants=True))
    assert done.more and done.released == 1000 and "relay" in store.calls


def test_a_slot_that_cannot_fire_is_skipped_and_the_others_fire() -> None:
    store = FakeReaperStore()
    store.due = [store.slot("bad"), store.slot("good", late_s=1)]
    store.fire_errors["bad"] = ValueError("payload over the queue's limit")
    assert asyncio.run(fire_due(store)) == 1
    assert store.skipped == [("bad", "payload over the queue's limit")]
    store.fire_errors["bad"] = DatabaseUnavailable("away")  # heals: raised, not skipped
    with pytest.raises(DatabaseUnavailable):
        asyncio.run(fire_due(store))


def test_lost_messages_are_counted_per_queue_and_an_unreachable_broker_skips_one() -> None:
    store = FakeReaperStore()
    store.lost = {"a": 3, "b": None, "c": 0}
    assert asyncio.run(republish_lost(store, 15.0)) == 3


def test_retention_prunes_batches_until_one_comes_back_short() -> None:
    store = FakeReaperStore()
    store.pruned = [500, 500, 120, 500]
    assert asyncio.run(prune_expired(store, 500, 10)) == 1120
    assert store.calls.count("prune_finished") == 3 and "prune_keys" in store.calls


def test_a_signalled_job_is_woken_and_relayed_in_the_same_sweep() -> None:
    store = FakeReaperStore()
    store.woken = 2
    done = sweep(store, Probe(False, False, False, False, False, None, signals=True))
    assert done.woken == 2
    assert store.calls.index("wake_signalled") < store.calls.index("relay")
    store = FakeReaperStore()
    sweep(store, NOTHING)
    assert "wake_signalled" not in store.calls  # no signal waits: no statement
