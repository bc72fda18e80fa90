"""Typed task handles (issue #32) against real services: ``@app.task``
gives a handle that publishes without naming the queue, from async code
(the app's own client per event loop, or one passed in) and from sync code
(the app's SyncClient); options land on the row; a payload that does not fit
the model is refused before anything is written; the consumer runs it."""

from __future__ import annotations

import threading
import uuid

import pytest

from harness import apps
from jobq import InvalidPayload
from jobq.settings import Settings
from tests.integration.test_consumer import World, _app_db, scenario  # noqa: F401 (fixture)


def test_a_handle_publishes_async_and_sync_and_the_consumer_runs_it(settings: Settings) -> None:
    async def body(w: World) -> None:
        apps.app.settings = settings
        try:
            given = await apps.typed.publish(apps.Email(to="a@b.c", subject="given"),
                                             client=w.client)
            own = await apps.typed.publish(apps.Email(to="a@b.c", subject="own"), priority=7,
                                           key="tenant-1")
            from_thread: list[uuid.UUID] = []
            t = threading.Thread(target=lambda: from_thread.append(apps.typed.publish_sync(
                apps.Email(to="a@b.c", subject="sync"), delay_s=0.2)))
            t.start()
            t.join(30)
            for jid in (given, own, *from_thread):
                await w.wait_status(jid, "completed")
            rows = await w.pool.fetch("SELECT id, queue, payload->>'subject' AS s, priority, "
                                      "key FROM jobq.job ORDER BY s")
            assert [(r["queue"], r["s"], r["priority"], r["key"]) for r in rows] == [
                ("typed", "given", 0, None), ("typed", "own", 7, "tenant-1"),
                ("typed", "sync", 0, None)]
        finally:
            await apps.app.aclose()
            apps.app.settings = None

    scenario(settings, body)


def test_a_payload_that_does_not_fit_is_refused_and_nothing_is_written(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        with pytest.raises(InvalidPayload,
                           match=r"does not fit Email: 1 error\(s\): Field required at subject"):
            await apps.typed.publish({"to": "a@b.c"}, client=w.client)  # type: ignore[arg-type]
        half = apps.Email.model_construct(to="a@b.c")  # skips validation; the handle does not
        with pytest.raises(InvalidPayload, match="pass a valid Email"):
            await apps.typed.publish(half, client=w.client)
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job") == 0

    scenario(settings, body)
