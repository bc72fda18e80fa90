"""An app with middleware and an end hook (issue #50, handlers.py), for the
hooks' tests: the middleware puts the payload's "tenant" in a context
variable for the run; the end hook appends each run's end to the JSON-lines
file JOBQ_TEST_HOOKLOG. Handlers return what they saw of the tenant."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from jobq import App, Job, RunEnd

app = App()
tenant: ContextVar[str | None] = ContextVar("tenant", default=None)


def _write(record: dict[str, Any]) -> None:
    with open(os.environ["JOBQ_TEST_HOOKLOG"], "a") as f:
        f.write(json.dumps(record) + "\n")


@app.around
async def with_tenant(job: Job, call_next: Callable[[], Awaitable[Any]]) -> Any:
    token = tenant.set((job.payload or {}).get("tenant"))
    try:
        return await call_next()
    finally:
        tenant.reset(token)


@app.on_end
def ended(end: RunEnd) -> None:
    _write({"id": str(end.id), "queue": end.queue, "attempt": end.attempt,
            "outcome": end.outcome, "duration_s": end.duration_s,
            "error": type(end.error).__name__ if end.error is not None else None})


@app.handler("hook_async")
async def hook_async(job: Job) -> Any:
    if (job.payload or {}).get("fail"):
        raise KeyError("x")
    return tenant.get()


@app.handler("hook_sync")
def hook_sync(job: Job) -> Any:
    return tenant.get()  # a thread sees the middleware's context; a child process does not
