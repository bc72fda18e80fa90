"""A demo app to try the services without writing code.

    jobq consume jobq.demo:app

- ``echo``:  logs its payload.
- ``sleep``: sleeps ``payload["seconds"]`` (default 1), checking for a stop.
- ``flaky``: fails until its attempt number exceeds ``payload["fail_times"]``.
- ``crash``: kills its own process (SIGKILL) while ``attempt <= payload["times"]``
  (default: always), to watch the reaper and the job-of-death limit at work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from jobq.app import App
from jobq.job import Job

log = logging.getLogger("jobq.demo")
app = App()


@app.handler("echo")
async def echo(job: Job) -> None:
    log.info("echo %s: %s", job.id, job.payload)


@app.handler("sleep")
async def sleep(job: Job) -> None:
    await asyncio.sleep(float((job.payload or {}).get("seconds", 1)))


@app.handler("flaky")
def flaky(job: Job) -> None:
    if job.attempt <= int((job.payload or {}).get("fail_times", 1)):
        raise RuntimeError(f"flaky: failing attempt {job.attempt} on purpose")


@app.handler("crash")
def crash(job: Job) -> None:
    times = (job.payload or {}).get("times")
    if times is None or job.attempt <= int(times):
        os.kill(os.getpid(), signal.SIGKILL)
