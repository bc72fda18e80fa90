"""The test app's handlers that stream output (issue #52, item 5):
``{"chunks": n, "every": s}`` emits n chunks ``{"i": i, "attempt": a}``, s
seconds apart; ``"fail_first": true`` fails the first run after them (so a
retry emits again); ``"kill_at": k`` SIGKILLs its own process after chunk k
of the first run. ``emits_sync`` is the same from a sync handler
(``job.emit_sync``). Each run is in ``test_run`` (harness/apps.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from jobq import Job


async def emits(job: Job, start: Any, end: Any) -> Any:
    p = job.payload or {}
    await start(job)
    n = int(p.get("chunks", 3))
    for i in range(n):
        await job.emit({"i": i, "attempt": job.attempt, "at": time.time()})
        if p.get("kill_at") == i and job.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(float(p.get("every", 0)))
    if p.get("fail_first") and job.attempt == 1:
        await end(job, "raised")
        raise RuntimeError("the first run fails after its output")
    await end(job, "returned")
    return {"emitted": n}


def emits_sync(job: Job) -> Any:
    p = job.payload or {}
    for i in range(int(p.get("chunks", 3))):
        job.emit_sync({"i": i, "attempt": job.attempt})
        time.sleep(float(p.get("every", 0)))
    return {"emitted": int(p.get("chunks", 3))}
