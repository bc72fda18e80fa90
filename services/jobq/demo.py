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


# ── a demo producer: python -m jobq.demo --rate 5 ──

async def _produce(rate: float, count: int | None) -> None:
    import random

    from jobq.client.producer import Client
    from jobq.newjob import NewJob
    from jobq.settings import Settings

    stop = asyncio.Event()  # Ctrl-C or SIGTERM: finish the publish under way, close, exit
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = Client(Settings())
    await client.connect(wait=True)
    sent = 0
    try:
        while (count is None or sent < count) and not stop.is_set():
            kind = random.random()
            if kind < 0.6:
                job = NewJob("echo", {"n": sent})
            elif kind < 0.85:
                # 25 % of 5 jobs/s at 2.75 s each: ~3.4 of the demo's 8 slots busy,
                # so it keeps up (sleeps up to 20 s once made its backlog grow forever)
                job = NewJob("sleep", {"seconds": round(random.uniform(0.5, 5), 1)})
            elif kind < 0.99:
                job = NewJob("flaky", {"fail_times": random.randint(1, 3)})
            else:
                job = NewJob("crash", {"times": 1})  # kills one consumer, then succeeds
            try:
                await client.publish_many([job])
                sent += 1
            except Exception as exc:  # keep trickling through outages
                log.warning("demo producer: publish failed: %s", exc)
            try:
                await asyncio.wait_for(stop.wait(), 1 / rate)
            except TimeoutError:
                pass
    finally:
        await client.close()


def main() -> None:
    import argparse

    from jobq.telemetry import logs

    p = argparse.ArgumentParser(description="Publish a steady trickle of demo jobs: mostly "
                                "echo, some sleeps, some that fail a few times, and "
                                "now and then one that kills its consumer once.")
    p.add_argument("--rate", type=float, default=5.0, help="jobs per second (default 5)")
    p.add_argument("--count", type=int, default=None, help="stop after this many")
    args = p.parse_args()
    logs.setup("INFO")
    asyncio.run(_produce(args.rate, args.count))


if __name__ == "__main__":
    main()
