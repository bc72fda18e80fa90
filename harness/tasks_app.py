"""Several named tasks on one queue (issue #50, item 3), for
tests/e2e/test_named_tasks.py: a typed async task, a sync one (thread pool or
--pool process) and one whose retries are its own."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from jobq import App, Job

app = App()


class Welcome(BaseModel):
    email: str


@app.task("default", name="send_welcome", payload=Welcome)
async def send_welcome(job: Job[Welcome]) -> dict[str, str]:
    return {"welcomed": job.payload.email}


@app.handler("default", task="resize")
def resize(job: Job[Any]) -> dict[str, Any]:
    return {"resized": job.payload["w"] * 2}


@app.handler("default", task="fragile", max_attempts=2, backoff_base_s=0)
async def fragile(job: Job[Any]) -> None:
    raise ValueError("never works")
