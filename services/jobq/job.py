"""The job as a handler sees it, and the states of a job row.

::

    queued ──claim──► active ──complete──► completed
      ▲                 │ ├──fail (attempts left)──► queued (after backoff)
      │                 │ ├──fail (no attempts left)──► failed
      │                 │ └──release (shutdown)──► queued (at once)
      └──reaper: lease lapsed (stalls+1)──┘   └─► failed (stalls > max_stalls)
    queued/active ──cancel──► cancelled
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic

import asyncpg
from typing_extensions import TypeVar

from jobq import lease  # the one writer of lease columns (job.complete_in)
from jobq.db import PooledConnection
from jobq.errors import Fail, LeaseLost
from jobq.status import Status as Status  # its home is status.py; re-exported

# The payload's type: a handler registered with ``payload=Model`` may annotate
# ``job: jobq.Job[Model]`` and mypy knows ``job.payload``; a bare ``Job`` is
# ``Job[Any]`` (the payload as decoded JSON).
P = TypeVar("P", default=Any)


@dataclass(eq=False)
class Job(Generic[P]):
    """What a handler receives.

    ``lock`` is this run's lease token: unique per claim, so it is the fencing
    token to store beside a side effect to make the handler idempotent (a rerun
    after a crash gets a different token; ``attempt`` tells how many claims
    came before). ``stop_requested`` is set when the worker lost the lease or
    the job timed out; async handlers are also cancelled, sync handlers should
    check it between steps.
    """

    id: uuid.UUID
    queue: str
    payload: P
    attempt: int
    lock: uuid.UUID
    worker_id: str
    stalls: int = 0
    created_at: datetime | None = None
    completed_in_transaction: bool = field(default=False, repr=False)
    _stop: threading.Event | None = field(default=None, repr=False)
    _progress: Any = field(default=None, repr=False)
    _link: Any = field(default=None, repr=False)  # worker/steps.py: JobLink

    def attach_progress(self, writer: Any) -> None:
        self._progress = writer

    def attach_link(self, link: Any) -> None:
        self._link = link

    def _linked(self) -> Any:
        if self._link is None:  # a child process (--pool process): no retry can help
            raise Fail("steps, parents, emit, sleeps, waits and children need a job run by "
                       "a consumer (--pool thread or an async handler); jobq.testing runs "
                       "them in memory")
        return self._link

    async def step(self, name: str, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` once per job: a later run of this job (after a
        crash or a retry) gets the stored result without calling ``fn``. The
        result (JSON) is recorded, fenced by this run's token, before it is
        returned; a step that raises is not recorded. See worker/steps.py
        for what it does not promise, and ``step_key``."""
        return await self._linked().step(name, fn, *args)

    def step_sync(self, name: str, fn: Any, *args: Any) -> Any:
        """``step`` for sync handlers (run in the consumer's thread pool)."""
        return self._linked().step_sync(name, fn, *args)

    async def sleep(self, name: str, seconds: float) -> None:
        """Wait ``seconds`` holding nothing (I12): the run ends now and the
        job runs again from the top once they passed (by the database
        clock); that run, and any after it, returns from here at once, as
        earlier steps return their records. ``name`` names this sleep among
        the job's (one per name). Let the exception it raises propagate."""
        await self._linked().sleep(name, seconds)

    async def wait_for(self, name: str, timeout_s: float | None = None) -> Any:
        """The payload of signal ``name`` (``client.signal(job_id, name,
        payload)``, ``jobq.signal`` in SQL), kept for every later run. Until
        it comes the run ends and the job waits holding nothing (I12), at most
        ``timeout_s`` from its first wait: then :class:`jobq.SignalTimeout`.
        A signal sent before the wait is kept. Let the exception that ends
        the run propagate."""
        return await self._linked().wait_for(name, timeout_s)

    async def spawn(self, name: str, queue: str, payload: Any = None, *, delay_s: float = 0,
                    priority: int = 0, key: str | None = None) -> uuid.UUID:
        """Publish a child job, once per ``name`` across all runs of this
        job: a later run (after a crash, a wait) gets the same child's id.
        The child's insert and the record of its id commit together."""
        child: uuid.UUID = await self._linked().spawn(name, queue, payload, delay_s=delay_s,
                                                      priority=priority, key=key)
        return child

    async def join(self, ids: Any) -> list[Any]:
        """The results of jobs ``ids`` (children this job spawned; another
        job's id fails this one at once) in order once every one ended: a
        completed job's result, a failed or cancelled one's as a
        :class:`jobq.JobFailed` value (not raised). Until then the run ends
        and this job waits holding nothing (I12); cancelling it cancels the
        children it still waits for. Let the exception that ends the run
        propagate."""
        results: list[Any] = await self._linked().join(ids)
        return results

    async def emit(self, chunk: Any) -> int:
        """Stream ``chunk`` (JSON) to readers of ``client.stream(job.id)``:
        stored in order with the job (durable when this returns) and its
        offset returned. Chunks of every run are kept; a reader sees where a
        re-run starts (:class:`jobq.RunBoundary`)."""
        n: int = await self._linked().emit(chunk)
        return n

    def emit_sync(self, chunk: Any) -> int:
        """``emit`` for sync handlers (run in the consumer's thread pool)."""
        n: int = self._linked().emit_sync(chunk)
        return n

    # Sync twins (issue #52.6) for sync handlers in the consumer's thread pool:
    # each runs its coroutine on the consumer's loop while this thread waits,
    # and raises what it raises (the exception that ends the run included).
    def sleep_sync(self, name: str, seconds: float) -> None:
        """``sleep`` for sync handlers."""
        self._sync("sleep", name, seconds)

    def wait_for_sync(self, name: str, timeout_s: float | None = None) -> Any:
        """``wait_for`` for sync handlers."""
        return self._sync("wait_for", name, timeout_s)

    def spawn_sync(self, name: str, queue: str, payload: Any = None, *, delay_s: float = 0,
                   priority: int = 0, key: str | None = None) -> uuid.UUID:
        """``spawn`` for sync handlers."""
        child: uuid.UUID = self._sync("spawn", name, queue, payload, delay_s=delay_s,
                                      priority=priority, key=key)
        return child

    def join_sync(self, ids: Any) -> list[Any]:
        """``join`` for sync handlers."""
        results: list[Any] = self._sync("join", ids)
        return results

    def _sync(self, method: str, *args: Any, **options: Any) -> Any:
        link = self._linked()
        loop = getattr(link, "loop", None)
        if loop is None:  # jobq.testing's memory: no consumer's loop to hand it to
            return asyncio.run(getattr(link, method)(*args, **options))
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:  # it would wait for itself
            raise RuntimeError(f"job.{method}_sync() is for sync handlers; await "
                               f"job.{method}() in an async handler")
        return asyncio.run_coroutine_threadsafe(getattr(link, method)(*args, **options),
                                                loop).result()

    def step_key(self, name: str) -> str:
        """The same on every run of this job: an idempotency key for the
        side effect of step ``name`` (a payment API's, an email's)."""
        return f"{self.id}:{name}"

    async def parents(self) -> dict[uuid.UUID, Any]:
        """The jobs this one waited for (``after``): id -> stored result."""
        result: dict[uuid.UUID, Any] = await self._linked().parents()
        return result

    async def progress(self, value: Any) -> None:
        """Report progress (a number or a small JSON object): stored on the
        job's row, fenced, at most once a second (the latest value wins);
        shown in ``jobq.running`` and ``jobq inspect``. Async handlers (sync ones:
        ``progress_sync``).
        Raises :class:`LeaseLost` if the lease is gone."""
        if self._progress is None:
            raise RuntimeError("job.progress() works in async handlers run by a consumer")
        await self._progress.set(value)

    def progress_sync(self, value: Any) -> None:
        """``progress`` for sync handlers in the consumer's thread pool: the
        write runs on the consumer's loop while this thread waits for it
        (the same rate limit and fence; :class:`LeaseLost` if the lease is
        gone). Not in a ``--pool process`` child (no link to the database)."""
        if self._progress is None or self._link is None or not hasattr(self._link, "loop"):
            raise RuntimeError("job.progress_sync() works in sync handlers run by a consumer's "
                               "thread pool")
        asyncio.run_coroutine_threadsafe(self._progress.set(value), self._link.loop).result()

    @property
    def stop_requested(self) -> threading.Event:
        """Set when the worker lost the lease, the job timed out or the worker
        shuts down (created on first use: most jobs never look at it)."""
        if self._stop is None:
            self._stop = threading.Event()
        return self._stop

    @property
    def token(self) -> uuid.UUID:
        """Alias of ``lock``: the fencing token of this run."""
        return self.lock

    async def complete_in(self, conn: asyncpg.Connection | PooledConnection) -> None:
        """Complete the job inside the caller's open transaction.

        Use it when the handler writes to the same database: the handler's own
        writes and the completion then commit (or roll back) together, so a
        crash can never leave "side effect done, job still active". Raises
        :class:`LeaseLost` if the lease is gone; let it propagate so the
        caller's transaction rolls back.
        """
        if not await lease.complete_in(conn, self.id, self.lock):
            raise LeaseLost(f"job {self.id}: lease lost before completion")
        self.completed_in_transaction = True
