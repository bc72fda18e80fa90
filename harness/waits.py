"""The test app's handler that waits without holding anything (issue #52):
``{"sleep_s": s}`` sleeps durably, ``{"signal": name, "timeout_s": t}``
waits for a signal; ``{"join": [id, ...]}`` joins those; ``{"spawn": n,
"children": [payload, ...], "kill_after_spawn": true}`` spawns n children
into queue "work" (the given payloads, in turn) and joins them, a SIGKILL of
its own process right after the spawns on its first run if asked; all after
a durable step ("first", a random id recorded once), so a test can tell
that a re-run answered it from the record. Each run is in ``test_run``
(harness/apps.py), outcome ``suspended`` for a run that ended to wait.
Returns what it got."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

from jobq import Job, JobFailed, SignalTimeout
from jobq.errors import Suspended


def _stamp() -> str:
    return str(uuid.uuid4())


async def waits(job: Job, start: Any, end: Any) -> Any:
    p = job.payload or {}
    await start(job)
    try:
        first = await job.step("first", _stamp)
        if p.get("sleep_s") is not None:
            await job.sleep("nap", float(p["sleep_s"]))
        got = None
        if p.get("signal"):
            got = await job.wait_for(p["signal"], timeout_s=p.get("timeout_s"))
        if p.get("join"):  # ids it did not spawn (test_suspension: refused)
            got = await job.join(p["join"])
        if p.get("spawn"):
            kids = p.get("children") or [{}]
            ids = [await job.spawn(f"c{i}", "work", kids[i % len(kids)])
                   for i in range(int(p["spawn"]))]
            if p.get("kill_after_spawn") and job.attempt == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            results = await job.join(ids)
            got = [{"failed": r.status} if isinstance(r, JobFailed) else r for r in results]
    except Suspended:
        await end(job, "suspended")
        raise
    except SignalTimeout:
        await end(job, "timed_out")
        return {"first": first, "timed_out": True}
    await end(job, "returned")
    return {"first": first, "got": got}


def waits_sync(job: Job) -> Any:
    """The same in a sync handler (the consumer's thread pool), with the sync
    twins: ``{"sleep_s": s, "signal": name, "spawn": n}`` sleeps, then waits
    for the signal, then spawns n empty children into "work" and joins them."""
    p = job.payload or {}
    first = job.step_sync("first", _stamp)
    if p.get("sleep_s") is not None:
        job.sleep_sync("nap", float(p["sleep_s"]))
    got: Any = None
    if p.get("signal"):
        got = job.wait_for_sync(p["signal"], timeout_s=p.get("timeout_s"))
    if p.get("spawn"):
        ids = [job.spawn_sync(f"c{i}", "work", {}) for i in range(int(p["spawn"]))]
        got = [got, job.join_sync(ids)]
    return {"first": first, "got": got}
