"""``jobq.SyncClient``: the client for sync code (Django and Flask views,
scripts, Celery-style ``.delay`` call sites), with the async client's
signatures.

One event loop in a daemon thread runs one :class:`jobq.Client` (one pool,
one broker connection) for the whole process; every thread's call is a
coroutine submitted to it, so concurrent publishes from a thread pool share
its group commit and nobody opens a connection per call. The loop starts on
first use, not at construction, so a module-level ``SyncClient()`` costs
nothing at import.

``fork()`` (gunicorn preforks after importing the app): a child must not use
its parent's sockets. The client remembers the process it connected in; in
a forked child the first call starts a loop and connections of the child's
own, and the parent's are left to the parent. After ``close()`` every call
raises :class:`ClientClosed`, which says what to do.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from typing_extensions import Unpack

from jobq.client.producer import Client
from jobq.client.workflow import Workflow
from jobq.errors import JobqError
from jobq.newjob import JobOptions, NewJob, new_job
from jobq.settings import Settings

T = TypeVar("T")


_clients: weakref.WeakSet[SyncClient] = weakref.WeakSet()
# A forked child keeps its parent's client objects unreachable but alive:
# collecting them could close sockets the parent still uses.
_inherited: list[Any] = []


def _after_fork_in_child() -> None:
    for c in list(_clients):
        c._lock = threading.Lock()  # another thread may have held it at the fork
        if c._client is not None:
            _inherited.append((c._loop, c._client))


os.register_at_fork(after_in_child=_after_fork_in_child)


class ClientClosed(JobqError):
    """The SyncClient was closed: create a new one (or do not close it)."""


class SyncClient:
    """``with jobq.SyncClient() as c: c.publish("emails", {...})``."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._lock = threading.Lock()
        self._pid: int | None = None  # the process whose loop and client these are
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Client | None = None
        self._closed = False
        _clients.add(self)

    # ── the async client's signatures ──

    def publish(self, queue: str, payload: Any = None,
                **options: Unpack[JobOptions]) -> uuid.UUID:
        """Enqueue one job and publish its id; returns the job id."""
        (job_id,) = self.publish_many([new_job(queue, payload, options)])
        return job_id

    def publish_many(self, jobs: Iterable[NewJob], *, relay: bool = False) -> list[uuid.UUID]:
        """Many jobs in one transaction; ``relay=True``: bulk, the reapers
        publish the ids (the async client's publish_many says more)."""
        jobs = list(jobs)
        ids: list[uuid.UUID] = self._call(lambda c: c.publish_many(jobs, relay=relay))
        return ids

    def publish_workflow(self, workflow: Workflow) -> uuid.UUID:
        workflow_id: uuid.UUID = self._call(lambda c: c.publish_workflow(workflow))
        return workflow_id

    def result(self, job_id: uuid.UUID, timeout: float | None = None) -> Any:
        """The job's result once it completed (``jobq.JobFailed`` if it failed
        or was cancelled, ``TimeoutError`` after ``timeout`` seconds)."""
        return self._call(lambda c: c.result(job_id, timeout=timeout))

    def signal(self, job_id: uuid.UUID, name: str, payload: Any = None) -> bool:
        """Send signal ``name`` to a job (``Client.signal``): True if kept,
        False if one of that name was sent before."""
        return bool(self._call(lambda c: c.signal(job_id, name, payload)))

    # ── life cycle ──

    def stream(self, job_id: uuid.UUID, from_offset: int = 0) -> Iterator[Any]:
        """``Client.stream`` as a plain iterator (each step on the client's loop)."""
        loop, client = self._started()
        agen = client.stream(job_id, from_offset)
        try:
            while True:
                try:
                    item = asyncio.run_coroutine_threadsafe(_next(agen), loop).result()
                except StopAsyncIteration:
                    return
                yield item
        finally:  # a reader that stopped early: the listening connection goes back
            asyncio.run_coroutine_threadsafe(agen.aclose(), loop).result(30)

    def close(self) -> None:
        """Close this process's connections; later calls raise ClientClosed."""
        with self._lock:
            self._closed = True
            loop, client, mine = self._loop, self._client, self._pid == os.getpid()
            self._loop = self._client = None
        if loop is not None and client is not None and mine:
            try:
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(30)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                while loop.is_running():  # its thread closes it once stopped
                    threading.Event().wait(0.01)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, make: Any) -> Any:
        loop, client = self._started()
        future: Future[Any] = asyncio.run_coroutine_threadsafe(_on(client, make), loop)
        return future.result()

    def _started(self) -> tuple[asyncio.AbstractEventLoop, Client]:
        with self._lock:
            if self._closed:
                raise ClientClosed("this jobq.SyncClient was closed: create a new one (one per "
                                   "process is enough; it is safe to share between threads)")
            if self._pid != os.getpid():  # first use, or first use in a forked child
                self._loop, self._client = self._start()
                self._pid = os.getpid()
            assert self._loop is not None and self._client is not None
            return self._loop, self._client

    def _start(self) -> tuple[asyncio.AbstractEventLoop, Client]:
        loop = asyncio.new_event_loop()
        threading.Thread(target=_serve, args=(loop,), name="jobq-sync-client",
                         daemon=True).start()
        client = Client(self.settings)
        try:
            asyncio.run_coroutine_threadsafe(client.connect(wait=False), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            raise
        return loop, client


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's thread: runs it until close() stops it, then closes it."""
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _next(agen: AsyncIterator[Any]) -> Any:
    return await agen.__anext__()


async def _on(client: Client, make: Any) -> Any:
    coro: Coroutine[Any, Any, Any] = make(client)
    return await coro
