"""An app whose handlers declare their retries (issue #50, item 4:
handlers.RetryPolicy), for tests/e2e/test_handler_retries.py. Each handler
raises what its payload's "raise" names, every run."""

from __future__ import annotations

import asyncio
from typing import Any

from jobq import App, Job

app = App()
ERRORS: dict[str, type[Exception]] = {"ValueError": ValueError, "KeyError": KeyError,
                                      "ConnectionError": ConnectionError,
                                      "RuntimeError": RuntimeError}


def _raise(job: Job[Any]) -> None:
    raise ERRORS[job.payload["raise"]](f"run {job.attempt}")


@app.handler("r_rules", max_attempts=4, backoff_base_s=0, retry_on=(ConnectionError,),
             fail_on=(ValueError,))
async def rules(job: Job[Any]) -> None:
    _raise(job)


@app.handler("r_backoff", max_attempts=3, backoff_base_s=0.3, backoff_max_s=0.6)
def backoff(job: Job[Any]) -> None:  # a sync handler (the thread pool)
    _raise(job)


@app.handler("r_timeout", max_attempts=1, timeout_s=0.5)
async def slow(job: Job[Any]) -> None:
    await asyncio.sleep(30)


@app.handler("r_child", max_attempts=3, backoff_base_s=0, retry_on=(ConnectionError,),
             fail_on=(ValueError,))
def in_child(job: Job[Any]) -> None:  # run with --pool process: decided in the child
    _raise(job)
