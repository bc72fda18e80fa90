"""Durable steps and parents' results, for a running job (issue #31).

``await job.step("charge", fn, *args)`` runs ``fn`` once per job, however
often the job runs: a step this job already recorded (a run before a crash
or a retry) returns its stored result without calling ``fn``; otherwise
``fn`` runs (a coroutine function is awaited, a plain one runs in a thread)
and its JSON result is recorded, fenced by the job's token, before it is
returned. A step that raises is not recorded.

What it does not promise: a crash between ``fn``'s side effect and the
record repeats that one step on the next run. ``job.step_key(name)`` is the
same on every run of the job: pass it to the service ``fn`` calls as its
idempotency key (a payment API's, an email provider's) and that window
closes too. A step name may not be reused with another function.

``job.step_sync`` is the same for sync handlers (``--pool thread``): it runs
the database part on the consumer's event loop. A handler in a child process
(``--pool process``) has no database connection: steps are refused there.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import uuid
from collections.abc import Callable
from typing import Any

from jobq import lease
from jobq.client.results import ResultInvalid, encode
from jobq.errors import LeaseLost, StepRefused
from jobq.worker import output, suspension, waits_store


def fn_name(fn: Callable[..., Any]) -> str:
    target = fn.func if isinstance(fn, functools.partial) else fn
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


class JobLink:
    """What a job's handler reaches in the database, as its holder."""

    def __init__(self, pool: Any, job_id: uuid.UUID, lock: uuid.UUID,
                 max_result_bytes: int) -> None:
        self.pool = pool
        self.job_id = job_id
        self.lock = lock
        self.max_result_bytes = max_result_bytes
        self.loop = asyncio.get_running_loop()
        self._emitting: asyncio.Lock | None = None  # one emit at a time (output.py); made
        # at the first emit: most runs never emit, and a lock a job was measurable
        self._names: dict[str, str] | None = None  # recorded steps' names (_recorded)

    async def parents(self) -> dict[uuid.UUID, Any]:
        rows = await lease.parents(self.pool, self.job_id, self.lock)
        return {r["id"]: (json.loads(r["result"]) if r["result"] is not None else None)
                for r in rows}

    async def sleep(self, name: str, seconds: float) -> None:
        await suspension.sleep(self, name, seconds)

    async def wait_for(self, name: str, timeout_s: float | None) -> Any:
        return await suspension.wait_for(self, name, timeout_s)

    async def spawn(self, name: str, queue: str, payload: Any, **options: Any) -> Any:
        return await suspension.spawn(self, name, queue, payload, **options)

    async def join(self, ids: Any) -> list[Any]:
        return await suspension.join(self, ids)

    async def emit(self, chunk: Any) -> int:
        if self._emitting is None:
            self._emitting = asyncio.Lock()
        return await output.emit(self, chunk, self._emitting)

    def emit_sync(self, chunk: Any) -> int:
        n: int = asyncio.run_coroutine_threadsafe(self.emit(chunk), self.loop).result()
        return n

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        if not isinstance(name, str) or not 1 <= len(name.encode()) <= 200:
            raise StepRefused("a step name is 1 to 200 bytes of text")
        who = fn_name(fn)
        done = await self._recorded(name, who)
        if done is not None:
            return done[0]
        if inspect.iscoroutinefunction(fn):
            value = await fn(*args)
        else:
            value = await asyncio.to_thread(fn, *args)
        return await self._record(name, who, value)

    def step_sync(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """From a sync handler's thread: the step, on the consumer's loop
        (``fn`` itself runs in this thread)."""
        if asyncio.iscoroutinefunction(fn):
            raise StepRefused("job.step_sync takes a plain function; await job.step for a "
                           "coroutine function")
        who = fn_name(fn)
        done = asyncio.run_coroutine_threadsafe(self._recorded(name, who), self.loop).result()
        if done is not None:
            return done[0]
        value = fn(*args)
        return asyncio.run_coroutine_threadsafe(self._record(name, who, value),
                                                self.loop).result()

    async def _record(self, name: str, who: str, value: Any) -> Any:
        try:
            text = encode(value, self.max_result_bytes)
        except ResultInvalid as exc:
            raise StepRefused(f"step {name!r}: {exc}") from None
        if await lease.step_record(self.pool, self.job_id, self.lock, name, who, text):
            if self._names is not None:
                self._names[name] = who
            return json.loads(text) if text is not None else None
        again = await self._recorded(name, who, fresh=True)  # a retried record, reply lost
        if again is None:
            raise LeaseLost(f"job {self.job_id}: lease lost before step {name!r} was recorded")
        return again[0]

    async def recorded_names(self) -> dict[str, str]:
        """Name -> function of every step recorded by now (read once a run)."""
        if self._names is None:
            names = await waits_store.step_names(self.pool, self.job_id, self.lock)
            if self._names is None:  # two first lookups at once: the first read wins,
                self._names = names  # with what this run recorded since in it
        return self._names

    async def _recorded(self, name: str, who: str, fresh: bool = False) -> tuple[Any] | None:
        """(result,) if this job recorded the step; BadInput if with another fn.
        The run's first lookup reads the names of every recorded step; a name
        not among them (nor recorded by this run since) is a miss without a
        statement: only this run, the lease's holder, records steps now."""
        if not fresh and name not in await self.recorded_names():
            return None
        row = await lease.step_get(self.pool, self.job_id, self.lock, name)
        if row is None:
            return None
        fn, result = row
        if fn != who:
            raise StepRefused(f"step {name!r} was recorded by {fn}, not {who}: a step name "
                              "names one function")
        return (json.loads(result) if result is not None else None,)
