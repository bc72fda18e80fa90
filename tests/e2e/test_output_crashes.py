"""Streamed output through a SIGKILL (issue #52, item 5): a consumer killed
right after its handler's third chunk. A reader that follows the job from
before it started keeps every chunk the dead run stored, then gets a
RunBoundary and the re-run's chunks, in order, each once; the stream ends
when the job completes. Real processes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, publish, set_queue, wait_until
from jobq import Chunk, RunBoundary, SyncClient
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def test_a_reader_follows_a_stream_across_a_sigkilled_run(
        settings: Settings, db: SyncDB, procs: Procs) -> None:
    set_queue(db, "emits", lease_s=1)
    procs.reaper()
    (jid,) = publish(settings, "emits", [{"chunks": 5, "every": 0.05, "kill_at": 2}])
    got: list[Any] = []

    def follow() -> None:
        with SyncClient(settings) as client:
            got.extend(client.stream(jid))

    reader = threading.Thread(target=follow)
    reader.start()
    first = procs.consumer("--queue", "emits", "--concurrency", "1")
    wait_until(lambda: not first.alive(), 30, "the handler's SIGKILL of its consumer")
    procs.consumer("--queue", "emits", "--concurrency", "1")
    reader.join(60)
    assert not reader.is_alive(), "the stream did not end with the job"
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "completed"
    chunks = [(c.offset, c.data["i"], c.attempt) for c in got if isinstance(c, Chunk)]
    assert chunks == [(1, 0, 1), (2, 1, 1), (3, 2, 1)] + [
        (4 + i, i, 2) for i in range(5)], chunks
    assert got[3] == RunBoundary(2) and sum(isinstance(c, RunBoundary) for c in got) == 1
