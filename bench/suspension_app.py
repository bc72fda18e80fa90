"""The handlers of bench/suspension_cost.py (issue #52's figures).

``steps``: ``{"n": k, "async": bool}`` records k durable steps of a no-op
function (a sync one, run in a thread as job.step runs it, or a coroutine
function) and returns each one's time in ms, measured around ``job.step``.
``sleeps``: ``{"s": seconds}`` sleeps durably once, then returns."""

from __future__ import annotations

import time

from jobq import App, Job

app = App()


def _noop() -> int:
    return 1


async def _anoop() -> int:
    return 1


@app.handler("steps")
async def steps(job: Job) -> list[float]:
    fn = _anoop if job.payload.get("async") else _noop
    took = []
    for i in range(int(job.payload["n"])):
        t = time.perf_counter()
        await job.step(f"s{i}", fn)
        took.append((time.perf_counter() - t) * 1000)
    return took


@app.handler("sleeps")
async def sleeps(job: Job) -> None:
    await job.sleep("nap", float(job.payload["s"]))
