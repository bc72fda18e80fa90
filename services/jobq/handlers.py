"""Which handler runs which queue, and the schedules an app declares: all a
consumer needs of an app (the worker imports this, never the clients).

``jobq.App`` is a :class:`Handlers` that also opens the clients its typed
tasks publish with (app.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from jobq.errors import BadInput, ConfigError, InvalidQueue
from jobq.hooks import Hooks, Middleware, RunEnd
from jobq.queues import check_queue_name
from jobq.schedules import Schedule

# A decorated function, returned as it was given (a Task stays a Task).
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Handler:
    queue: str
    fn: Callable[..., Any]
    is_async: bool
    payload_model: type[BaseModel] | None = None


class Handlers:
    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.schedules: dict[str, Schedule] = {}
        self.hooks = Hooks()  # around every run (hooks.py)

    def around(self, fn: Middleware) -> Middleware:
        """Middleware around every run: ``async def fn(job, call_next)``
        (a per-job context, a database session, timing); hooks.py."""
        return self.hooks.around(fn)

    def on_end(self, fn: Callable[[RunEnd], Any]) -> Callable[[RunEnd], Any]:
        """Call ``fn(end)`` after every run with its outcome, duration and
        error (Sentry, metrics); hooks.py."""
        return self.hooks.on_end(fn)

    def schedule(self, name: str, queue: str, *, cron: str | None = None,
                 every: float | None = None, timezone: str = "UTC",
                 payload: Any = None) -> None:
        """Declare a periodic job: a consumer of this app stores it in
        jobq.schedule at start; the reapers enqueue it once per slot."""
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
            target = getattr(fn, "fn", fn)  # a typed task's function
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

    @property
    def queues(self) -> list[str]:
        return sorted(self.handlers)
