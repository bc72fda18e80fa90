"""Waiting without holding anything (issue #52, DESIGN I12): ``job.sleep``
and ``job.wait_for`` for a running job.

Both end the handler's run by raising :class:`~jobq.errors.Suspended`; the
consumer then puts the job back to queued (the ``suspend`` statement): no
attempt counted, no lease, no slot. The job runs again from the top when it
is woken, and every step, sleep and signal it met before is answered from the
record, so the handler goes on past them:

- ``sleep(name, seconds)``: its end is recorded once, as a step named
  ``sleep:<name>`` holding the database clock's deadline; a re-run before it
  (a crash, a SIGKILL) suspends again until the same deadline, one after it
  returns. The relay publishes the job when due, as any delayed job.
- ``wait_for(name, timeout_s)``: the signal's payload if ``jobq.signal``
  stored one for this job (kept, so every later run reads the same); else
  the deadline is recorded once (step ``wait:<name>``) and the job suspends
  until the signal or the deadline. Past the deadline with no signal:
  :class:`~jobq.errors.SignalTimeout`.

- ``spawn(name, queue, payload, ...)``: a child job made once per name (its
  insert and the step recording its id commit together); its id.
- ``join(ids)``: the children's results in order once every one ended (a
  failed or cancelled child's as a :class:`~jobq.JobFailed` value, not
  raised); until then the run ends and the job waits, woken by the reapers
  once none is queued or running.

A wake is not lost to a race: the suspend statement looks for the signal in
the same statement that parks the job, and a signal it could not see yet is
left undelivered for the reapers' wake duty, which locks the row only if the
job still waits for it (model/suspend.pml checks the protocol). Handlers in
a child process (``--pool process``) have no database link: refused there.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from typing import Any

from jobq import db
from jobq.client.results import JobFailed
from jobq.errors import MAX_DELAY_S, BadInput, LeaseLost, SignalTimeout, StepRefused, Suspended
from jobq.newjob import NewJob, validate
from jobq.worker import waits_store

MAX_CHILDREN = 1000  # children one job may spawn (documented: docs/how-to/waiting.md)


def _name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= 200:
        raise StepRefused("a sleep or signal name is 1 to 200 bytes of text")
    return name


def _seconds(what: str, seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not math.isfinite(seconds) or not 0 <= seconds < MAX_DELAY_S:
        raise StepRefused(f"{what} takes a finite number of seconds from 0 to under a year, "
                          f"got {seconds!r}")
    return float(seconds)


async def _clock(link: Any) -> float:
    return float((await db.now(link.pool)).timestamp())


async def sleep(link: Any, name: str, seconds: float) -> None:
    """Return once ``seconds`` passed since this sleep first began (by the
    database clock); before that, end the run until then."""
    name, seconds = _name(name), _seconds("job.sleep", seconds)
    now = await _clock(link)
    done = await link._recorded(f"sleep:{name}", "jobq.sleep")
    until = float(done[0]["until"]) if done is not None else float(
        (await link._record(f"sleep:{name}", "jobq.sleep", {"until": now + seconds}))["until"])
    if now >= until:
        return
    raise Suspended(until, None, f"sleep {name!r} until {until:.3f}")


async def wait_for(link: Any, name: str, timeout_s: float | None = None) -> Any:
    """The payload of signal ``name`` sent to this job; until it comes, the
    run ends and the job waits (at most ``timeout_s`` from the first wait)."""
    name = _name(name)
    if timeout_s is not None:
        timeout_s = _seconds("job.wait_for(timeout_s=...)", timeout_s)
    got = await waits_store.signal_get(link.pool, link.job_id, link.lock, name)
    if got is not None:
        return json.loads(got[0])
    now = await _clock(link)
    done = await link._recorded(f"wait:{name}", "jobq.wait_for")
    if done is None:
        deadline = None if timeout_s is None else now + timeout_s
        done = (await link._record(f"wait:{name}", "jobq.wait_for", {"deadline": deadline}),)
    deadline = done[0]["deadline"]
    if deadline is not None and now >= float(deadline):
        raise SignalTimeout(name, timeout_s)
    raise Suspended(None if deadline is None else float(deadline), name,
                    f"waiting for signal {name!r}")


async def spawn(link: Any, name: str, queue: str, payload: Any = None, *, delay_s: float = 0,
                priority: int = 0, key: str | None = None) -> uuid.UUID:
    """The id of this job's child ``name``, published the first time only."""
    name = _name(name)
    job = NewJob(queue, payload, delay_s, None, priority, key)
    text = validate(job)  # the queue name, the options, the payload: one clear line
    made = await link.recorded_names()
    if f"spawn:{name}" not in made \
            and sum(n.startswith("spawn:") for n in made) >= MAX_CHILDREN:
        raise StepRefused(f"job.spawn: a job spawns at most {MAX_CHILDREN} children")
    try:
        child = await waits_store.spawn(link.pool, link.job_id, link.lock, name, queue,
                                        json.loads(text), delay_s, priority, key)
    except BadInput as exc:  # the queue's payload limit: the same on every run
        raise StepRefused(f"job.spawn({name!r}): {exc}") from None
    if child is None:
        raise LeaseLost(f"job {link.job_id}: lease lost before child {name!r} was spawned")
    made[f"spawn:{name}"] = "jobq.spawn"
    return child


async def join(link: Any, ids: Sequence[uuid.UUID | str]) -> list[Any]:
    """Each child's result, in order, once all ended; until then, wait."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    if not wanted:
        return []
    rows = await waits_store.children(link.pool, link.job_id, link.lock, wanted)
    if rows is None:
        raise LeaseLost(f"job {link.job_id}: lease lost before its children were joined")
    by_id = {c.id: c for c in rows}
    missing = [str(i) for i in wanted if i not in by_id]
    if missing:
        raise StepRefused(f"job.join: no job {', '.join(missing[:3])}")
    foreign = [str(c.id) for c in rows if not c.spawned]
    if foreign:
        raise StepRefused(f"job.join takes the children this job spawned (job.spawn); "
                          f"{', '.join(foreign[:3])} is not one")
    if any(c.status in ("queued", "active") for c in rows):
        raise Suspended(None, None, f"joining {len(wanted)} children", joining=wanted)
    out: list[Any] = []
    for i in wanted:
        c = by_id[i]
        if c.status == "completed":
            out.append(json.loads(c.result) if c.result is not None else None)
        else:
            out.append(JobFailed(c.id, c.status, c.last_error))
    return out
