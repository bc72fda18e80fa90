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
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from jobq.errors import ConfigError, InvalidQueue

QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")  # whole name: fullmatch
# Names jobq itself uses on the broker: <namespace>.dead is the dead-letter
# queue, and a job queue of that name made every relay sweep fail.
RESERVED_QUEUES = frozenset({"dead"})


def check_queue_name(name: object) -> str:
    """The name, if it can be a job queue; InvalidQueue (one line) if not."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidQueue(f"invalid queue name {name!r}: use 1-100 letters, digits, _ . : - "
                           "(first a letter or digit)")
    if name in RESERVED_QUEUES:
        raise InvalidQueue(f"queue name {name!r} is reserved (jobq's dead-letter queue); "
                           "choose another name")
    return name


@dataclass(frozen=True)
class Handler:
    queue: str
    fn: Callable[..., Any]
    is_async: bool
    payload_model: type[BaseModel] | None = None


class App:
    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.schedules: dict[str, Any] = {}  # name -> jobq.schedules.Schedule

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
                 name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Put over ``@app.handler(queue)``: also run that queue's handler on a
        schedule (named after the queue unless ``name`` is given)."""
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            queue = next((h.queue for h in self.handlers.values() if h.fn is fn), None)
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
