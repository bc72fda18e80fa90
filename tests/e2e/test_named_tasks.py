"""Several named tasks share a queue (issue #50, item 3), dispatched by the
row (its payload's envelope {"task": name, "payload": ...}), with a real
--pool process consumer (sync tasks in its children), and in memory (a sync
task in a thread, as the thread pool runs it). A
typed handle, `jobq publish --task` and SQL `jobq.enqueue` publish them; each
runs its own handler with its own payload model and retries; an unknown or
missing task name fails that job at once, naming the tasks there are."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, run_cli, set_queue, wait_until
from jobq import App, testing
from jobq.errors import ConfigError
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def _ended(db: SyncDB, ids: list[Any]) -> bool:
    return bool(db.val("SELECT count(*) FILTER (WHERE status IN ('completed', 'failed')) = $2 "
                       "FROM jobq.job WHERE id = ANY($1)", ids, len(ids)))


def test_named_tasks_on_one_queue_each_run_their_own_handler(
        db: SyncDB, procs: Procs, settings: Settings, env: dict[str, str]) -> None:
    from harness import tasks_app

    set_queue(db, "default", max_attempts=5)
    procs.reaper()
    # --pool process: the sync task runs in a child, which finds its handler
    # by queue and task; the async ones on the consumer's loop
    procs.start("consume", "harness.tasks_app:app", "--pool", "process").worker_id()
    tasks_app.app.settings = settings

    async def typed() -> Any:
        try:
            return await tasks_app.send_welcome.publish(tasks_app.Welcome(email="a@b.c"))
        finally:
            await tasks_app.app.aclose()

    welcome = asyncio.run(typed())
    out = run_cli(env, "publish", "default", '{"w": 21}', "--task", "resize")
    assert out.returncode == 0, out.stderr
    resized = out.stdout.strip().splitlines()[-1]
    by_sql = db.val("SELECT jobq.enqueue('default', jsonb_build_object('task', 'resize', "
                    "'payload', jsonb_build_object('w', 5)))")
    fragile = db.val("SELECT jobq.enqueue('default', '{\"task\": \"fragile\"}'::jsonb)")
    unknown = run_cli(env, "publish", "default", "{}", "--task", "nope").stdout.split()[-1]
    bare = db.val("SELECT jobq.enqueue('default', '{\"w\": 1}'::jsonb)")
    ids = [welcome, resized, by_sql, fragile, unknown, bare]
    wait_until(lambda: _ended(db, ids), 60, "every job ended")
    rows = {str(r["id"]): r for r in db.fetch(
        "SELECT id, status, result, errors, last_error FROM jobq.job WHERE id = ANY($1)", ids)}

    def result(jid: Any) -> Any:
        return json.loads(rows[str(jid)]["result"])

    assert result(welcome) == {"welcomed": "a@b.c"}
    assert result(resized) == {"resized": 42} and result(by_sql) == {"resized": 10}
    assert (rows[str(fragile)]["status"], rows[str(fragile)]["errors"]) == ("failed", 2)
    for jid, name in ((unknown, "'nope'"), (bare, "None")):
        row = rows[str(jid)]
        assert row["status"] == "failed" and row["errors"] == 1, dict(row)
        assert f"unknown task {name} on queue default" in row["last_error"], row["last_error"]
        assert "fragile, resize, send_welcome" in row["last_error"]


def test_named_tasks_in_memory_and_mistakes_at_registration() -> None:
    from harness import tasks_app

    got = asyncio.run(testing.run_job(tasks_app.app, tasks_app.send_welcome,
                                      tasks_app.Welcome(email="x@y.z")))
    assert got == {"welcomed": "x@y.z"}
    sync = asyncio.run(testing.run_job(tasks_app.app, "default",
                                       {"task": "resize", "payload": {"w": 2}}))
    assert sync == {"resized": 4}
    assert tasks_app.send_welcome.encode(tasks_app.Welcome(email="x@y.z")) == {
        "task": "send_welcome", "payload": {"email": "x@y.z"}}
    app = App()

    @app.handler("q")
    def plain(job: Any) -> None: ...

    with pytest.raises(ConfigError, match="name every handler"):
        app.handler("q", task="t")(plain)
    app2 = App()
    app2.handler("q", task="t")(plain)
    with pytest.raises(ConfigError, match="name this one too"):
        app2.handler("q")(plain)
    with pytest.raises(ConfigError, match="already has a handler"):
        app2.handler("q", task="t")(plain)
    with pytest.raises(ConfigError, match="invalid task name"):
        app2.handler("q", task="no spaces")(plain)
