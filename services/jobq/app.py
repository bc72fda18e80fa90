"""The application object: which handler runs which queue, and the clients
its typed tasks publish with.

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
The registry is ``handlers.py`` (what a consumer needs); the clients are
``client/defaults.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack, overload

from jobq.client.defaults import Clients
from jobq.client.producer import Client
from jobq.client.sync import SyncClient
from jobq.client.task import M, Task
from jobq.errors import ConfigError
from jobq.handlers import Handler, Handlers
from jobq.queues import QUEUE_NAME, RESERVED_QUEUES, check_queue_name
from jobq.runtime.retries import RetryOptions
from jobq.settings import Settings

__all__ = ["QUEUE_NAME", "RESERVED_QUEUES", "App", "Handler", "check_queue_name", "load"]


class App(Handlers):
    def __init__(self, settings: Settings | None = None) -> None:
        super().__init__()
        self.clients = Clients(settings)

    @property
    def settings(self) -> Settings | None:
        """The settings of the clients tasks open (None: Settings(), the
        environment's). Set later, it applies to the clients opened after."""
        return self.clients.settings

    @settings.setter
    def settings(self, value: Settings | None) -> None:
        # Once a copy of its own, the clients kept the value given to
        # __init__: a task then published into the environment's namespace
        # while its consumer read the test's (test_tasks, seen under load).
        self.clients.settings = value

    @overload
    def task(self, queue: str, *, payload: type[M], name: str | None = None,
             **retry: Unpack[RetryOptions]) -> Callable[[Callable[..., Any]], Task[M]]: ...
    @overload
    def task(self, queue: str, *, payload: None = None, name: str | None = None,
             **retry: Unpack[RetryOptions]) -> Callable[[Callable[..., Any]], Task[Any]]: ...

    def task(self, queue: str, *, payload: type[Any] | None = None, name: str | None = None,
             **retry: Unpack[RetryOptions]) -> Callable[[Callable[..., Any]], Task[Any]]:
        """``@app.handler`` that gives back a typed handle (client/task.py):
        ``await send_email.publish(Email(...))``, ``send_email.publish_sync(...)``;
        ``name``: one of several named tasks sharing ``queue``; the retry
        options as ``@app.handler``'s."""
        register = self.handler(queue, payload=payload, task=name, **retry)

        def wrap(fn: Callable[..., Any]) -> Task[Any]:
            return Task(self.clients, queue, register(fn), payload, name)

        return wrap

    # ── the clients tasks publish with, unless given one (client/defaults.py) ──

    def use(self, client: Client | SyncClient) -> None:
        """Tasks publish with ``client`` (its owner connects and closes it)."""
        self.clients.use(client)

    async def async_client(self) -> Client:
        return await self.clients.async_client()

    def sync_client(self) -> SyncClient:
        return self.clients.sync_client()

    async def aclose(self) -> None:
        """Close the clients this app opened itself (not those given to use())."""
        await self.clients.aclose()

    def close(self) -> None:
        self.clients.close()


def load(spec: str) -> App:
    """Import ``module:attribute`` and check it is an App (with Django set
    up first when DJANGO_SETTINGS_MODULE is set: jobq.contrib.django)."""
    import importlib

    from jobq.contrib import django

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"APP must look like module:attribute (e.g. jobq.demo:app), got {spec!r}")
    with_django = django.setup()  # DJANGO_SETTINGS_MODULE set: before the app imports models
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as exc:  # TypeError: a relative name
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise ConfigError(f"module {module_name} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigError(f"{spec} is not a jobq.App (got {type(app).__name__})")
    if with_django:
        django.instrument(app)
    return app
