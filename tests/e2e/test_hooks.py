"""Middleware and end hooks around every run (issue #50, handlers.py), in real
consumer processes: the middleware's context is seen by async handlers and
by sync handlers in threads, not in --pool process children (documented);
the end hook gets every run's id, queue, attempt, outcome, duration and
error, for all three kinds of handler; a failing run is reported with its
exception and retried as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, publish, set_queue, wait_until

pytestmark = pytest.mark.e2e


def _ends(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_middleware_and_end_hooks_run_around_every_kind_of_handler(
        db: SyncDB, procs: Procs, settings: Any, tmp_path: Path, pool: str) -> None:
    log = tmp_path / "hooks.jsonl"
    for q in ("hook_async", "hook_sync"):
        set_queue(db, q, max_attempts=2, backoff_base_s=0.1)
    procs.reaper()  # the retry is published by the relay
    procs.start("consume", "harness.hooks_app:app", "--pool", pool,
                JOBQ_TEST_HOOKLOG=str(log)).worker_id()
    a, bad = publish(settings, "hook_async", [{"tenant": "acme"}, {"fail": True}])
    (s,) = publish(settings, "hook_sync", [{"tenant": "acme"}])
    wait_until(lambda: len(_ends(log)) >= 4, 20, "four runs reported")
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status IN "
                              "('completed', 'failed')") == 3, 20, "all three ended")
    result = {r["id"]: r["result"] for r in db.fetch("SELECT id, result FROM jobq.job")}
    assert result[a] == '"acme"'
    assert result[s] == ('"acme"' if pool == "thread" else None)  # a child has no context
    ends = _ends(log)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for e in ends:
        by_id.setdefault(e["id"], []).append(e)
    assert [e["outcome"] for e in by_id[str(a)]] == ["ok"]
    assert [(e["outcome"], e["error"], e["attempt"]) for e in by_id[str(bad)]] == [
        ("error", "KeyError", 1), ("error", "KeyError", 2)]
    assert by_id[str(s)][0]["queue"] == "hook_sync" and by_id[str(s)][0]["outcome"] == "ok"
    assert all(e["duration_s"] >= 0 for e in ends)
