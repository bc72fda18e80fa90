"""The application object: which handler runs which queue.

::

    app = jobq.App()

    @app.handler("emails")
    async def send(job: jobq.Job) -> None: ...

    @app.handler("thumbnails", payload=ThumbnailRequest)   # pydantic model
    def resize(job: jobq.Job) -> None: ...                 # sync: runs in a thread

    @app.periodic(cron="0 3 * * *", timezone="Europe/Berlin")
    @app.handler("nightly")                                # also enqueued daily at 3:00
    async def nightly(job: jobq.Job) -> dict: ...          # the return value is its result

A payload model validates ``job.payload`` before the handler runs; a payload
that fails validation fails the job at once (no retries: it cannot get better).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import BaseModel

from jobq.errors import ConfigError, InvalidQueue
from jobq.queues import QUEUE_NAME, RESERVED_QUEUES, check_queue_name
from jobq.task import M, Task

if TYPE_CHECKING:
    from jobq.producer import Client
    from jobq.settings import Settings
    from jobq.sync_client import SyncClient

__all__ = ["QUEUE_NAME", "RESERVED_QUEUES", "App", "Handler", "check_queue_name", "load"]

# A decorated function, returned as it was given (a Task stays a Task).
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Handler:
    queue: str
    fn: Callable[..., Any]
    is_async: bool
    payload_model: type[BaseModel] | None = None


class App:
    def __init__(self, settings: Settings | None = None) -> None:
        self.handlers: dict[str, Handler] = {}
        self.schedules: dict[str, Any] = {}  # name -> jobq.schedules.Schedule
        self.settings = settings  # for the clients tasks open (None: Settings())
        self._sync: SyncClient | None = None  # task.publish_sync's default client
        self._async: dict[Any, Client] = {}  # event loop -> task.publish's default client
        self._given: list[Any] = []  # clients given to use(): theirs to close

    def schedule(self, name: str, queue: str, *, cron: str | None = None,
                 every: float | None = None, timezone: str = "UTC",
                 payload: Any = None) -> None:
        """Declare a periodic job: a consumer of this app stores it in
        jobq.schedule at start; the reapers enqueue it once per slot."""
        from jobq.errors import BadInput
        from jobq.schedules import Schedule

        try:
            self.schedules[name] = Schedule(name, queue, payload, cron, every, timezone)
        except (BadInput, TypeError) as exc:
            raise ConfigError(str(exc)) from exc

    def periodic(self, *, cron: str | None = None, every: float | None = None,
                 timezone: str = "UTC", payload: Any = None,
                 name: str | None = None) -> Callable[[F], F]:
        """Put over ``@app.handler(queue)``: also run that queue's handler on a
        schedule (named after the queue unless ``name`` is given)."""
        def register(fn: F) -> F:
            target = fn.fn if isinstance(fn, Task) else fn
            queue = next((h.queue for h in self.handlers.values() if h.fn is target), None)
            if queue is None:
                raise ConfigError("@app.periodic goes above @app.handler(queue)")
            self.schedule(name or queue, queue, cron=cron, every=every, timezone=timezone,
                          payload=payload)
            return fn

        return register

    def handler(
        self, queue: str, *, payload: type[BaseModel] | None = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        try:
            check_queue_name(queue)
        except InvalidQueue as exc:
            raise ConfigError(str(exc)) from exc

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if queue in self.handlers:
                raise ConfigError(f"queue {queue!r} already has a handler")
            self.handlers[queue] = Handler(queue, fn, inspect.iscoroutinefunction(fn), payload)
            return fn

        return register

    @overload
    def task(self, queue: str, *,
             payload: type[M]) -> Callable[[Callable[..., Any]], Task[M]]: ...
    @overload
    def task(self, queue: str, *, payload: None = None
             ) -> Callable[[Callable[..., Any]], Task[Any]]: ...

    def task(self, queue: str, *, payload: type[Any] | None = None
             ) -> Callable[[Callable[..., Any]], Task[Any]]:
        """``@app.handler`` that gives back a typed handle (jobq/task.py):
        ``await send_email.publish(Email(...))``, ``send_email.publish_sync(...)``."""
        register = self.handler(queue, payload=payload)

        def wrap(fn: Callable[..., Any]) -> Task[Any]:
            return Task(self, queue, register(fn), payload)

        return wrap

    # ── the clients tasks publish with, unless given one ──

    def use(self, client: Client | SyncClient) -> None:
        """Tasks publish with ``client`` (its owner connects and closes it)."""
        from jobq.sync_client import SyncClient

        if isinstance(client, SyncClient):
            self._sync = client
        else:
            self._async[None] = client  # any loop: the owner's
        self._given.append(client)

    async def async_client(self) -> Client:
        """The client ``task.publish`` uses: given to ``use``, else one per
        event loop, opened on first use."""
        import asyncio

        from jobq.producer import Client

        if None in self._async:
            return self._async[None]
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            client = self._async[loop] = Client(self.settings)
            try:
                await client.connect()
            except BaseException:
                del self._async[loop]
                raise
        return client

    def sync_client(self) -> SyncClient:
        """The client ``task.publish_sync`` uses (one per process, fork-safe)."""
        from jobq.sync_client import SyncClient

        if self._sync is None:
            self._sync = SyncClient(self.settings)
        return self._sync

    async def aclose(self) -> None:
        """Close the clients this app opened itself (not those given to use())."""
        import asyncio

        loop = asyncio.get_running_loop()
        client = self._async.pop(loop, None)
        if client is not None and client not in self._given:
            await client.close()
        self.close()

    def close(self) -> None:
        if self._sync is not None and self._sync not in self._given:
            self._sync.close()
            self._sync = None

    @property
    def queues(self) -> list[str]:
        return sorted(self.handlers)


def load(spec: str) -> App:
    """Import ``module:attribute`` and check it is an App."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"APP must look like module:attribute (e.g. jobq.demo:app), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as exc:  # TypeError: a relative name
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise ConfigError(f"module {module_name} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigError(f"{spec} is not a jobq.App (got {type(app).__name__})")
    return app
