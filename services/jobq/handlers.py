"""Which handler runs which queue, the schedules an app declares, and what
runs around every run (middleware and end hooks): all a consumer needs of an
app (the worker imports this, never the clients).

``jobq.App`` is a :class:`Handlers` that also opens the clients its typed
tasks publish with (app.py).

Around every run (issue #50): middleware and end hooks, for async, sync
(thread) and process-pool handlers alike.

::

    @app.around
    async def with_tenant(job: jobq.Job, call_next) -> Any:
        token = tenant.set(job.payload.get("tenant"))   # a per-job context
        try:
            return await call_next()                      # the handler (or the next one)
        finally:
            tenant.reset(token)

    @app.on_end
    def report(end: jobq.RunEnd) -> None:                 # after every run
        if end.error is not None and end.outcome == "error":
            sentry_sdk.capture_exception(end.error)

Middleware runs on the consumer's event loop, in registration order (the
first is outermost), around the handler call: a sync handler's thread and a
``--pool process`` child run inside it, and a context variable the
middleware sets is seen in the thread (not in a child process). What it
raises or returns is the handler's. End hooks get a :class:`RunEnd` once the
run's outcome is written (ok, error, timeout, lost, child_died, ...); an end
hook that raises is logged and never changes the job. Both may be async.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

from pydantic import BaseModel

from jobq.errors import BadInput, ConfigError, InvalidQueue
from jobq.job import Job
from jobq.queues import check_queue_name
from jobq.schedules import Schedule

# A decorated function, returned as it was given (a Task stays a Task).
F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("jobq.consumer")

Middleware = Callable[[Job, Callable[[], Awaitable[Any]]], Awaitable[Any]]


@dataclass(frozen=True)
class RunEnd:
    """One run of a job, as it ended: ``outcome`` is the label of
    ``jobq_handler_duration_seconds`` (ok, error, timeout, lost, child_died,
    handed_on, shutdown); ``error`` what the handler raised, if it did
    (also a jobq.Snooze, a suspension's jobq.errors.Suspended)."""

    job: Job
    outcome: str
    duration_s: float
    error: BaseException | None

    @property
    def id(self) -> Any:
        return self.job.id

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def attempt(self) -> int:
        return self.job.attempt


class Hooks:
    def __init__(self) -> None:
        self.middleware: list[Middleware] = []
        self.end_hooks: list[Callable[[RunEnd], Any]] = []

    def around(self, fn: Middleware) -> Middleware:
        """Register ``async def fn(job, call_next)`` around every run."""
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("@app.around takes an async function (job, call_next)")
        self.middleware.append(fn)
        return fn

    def on_end(self, fn: Callable[[RunEnd], Any]) -> Callable[[RunEnd], Any]:
        """Register ``fn(end: RunEnd)`` (sync or async) after every run."""
        self.end_hooks.append(fn)
        return fn

    async def call(self, job: Job, handler: Callable[[], Awaitable[Any]]) -> Any:
        """The handler call inside every middleware, the first outermost."""
        chain = handler
        for mw in reversed(self.middleware):
            chain = _link(mw, job, chain)
        return await chain()

    async def ended(self, end: RunEnd) -> None:
        for fn in self.end_hooks:
            try:
                value = fn(end)
                if inspect.isawaitable(value):
                    await value
            except Exception as exc:  # a hook's bug never changes the job
                log.warning("on_end hook %s raised %r; the job is unaffected",
                            getattr(fn, "__qualname__", fn), exc)


def _link(mw: Middleware, job: Job, inner: Callable[[], Awaitable[Any]]
          ) -> Callable[[], Awaitable[Any]]:
    async def step() -> Any:
        return await mw(job, inner)

    return step


ExceptionTypes = tuple[type[BaseException], ...]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries declared next to a handler (issue #50, item 4), over its
    queue's row, which stays the fleet-wide default for what is not given:
    ``max_attempts`` (runs that may fail, this one included), a backoff of
    ``backoff_base_s * 2**errors`` capped at ``backoff_max_s``, a
    ``timeout_s`` per run; ``fail_on`` exceptions fail the job at once, and
    with ``retry_on`` given only those are retried (the rest fail at once).
    ``jobq.Retry`` and ``jobq.Fail`` still say what they say."""

    max_attempts: int | None = None
    backoff_base_s: float | None = None
    backoff_max_s: float | None = None
    timeout_s: float | None = None
    retry_on: ExceptionTypes = ()
    fail_on: ExceptionTypes = ()

    def __post_init__(self) -> None:
        if self.max_attempts is not None and not (
                isinstance(self.max_attempts, int) and 1 <= self.max_attempts <= 1000):
            raise ConfigError(f"max_attempts must be a whole number from 1 to 1000, got "
                              f"{self.max_attempts!r}")
        for name in ("backoff_base_s", "backoff_max_s", "timeout_s"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not 0 <= v < 31_536_000 or (name == "timeout_s" and v == 0)):
                raise ConfigError(f"{name} must be a finite number of seconds (under a year"
                                  f"{', above 0' if name == 'timeout_s' else ''}), got {v!r}")
        for name in ("retry_on", "fail_on"):
            v = getattr(self, name)
            if not isinstance(v, tuple) or not all(
                    isinstance(t, type) and issubclass(t, BaseException) for t in v):
                raise ConfigError(f"{name} must be a tuple of exception classes, got {v!r}")

    def refused(self, exc: BaseException) -> str | None:
        """Why ``exc`` fails the job at once under this policy (None: it may
        be retried, as far as the policy goes)."""
        if self.fail_on and isinstance(exc, self.fail_on):
            return "fail_on"
        if self.retry_on and not isinstance(exc, self.retry_on):
            return "not in retry_on"
        return None

    def backoff(self, errors: int) -> float | None:
        """Seconds before the next try after ``errors`` failures (None: the
        queue's backoff)."""
        if self.backoff_base_s is None and self.backoff_max_s is None:
            return None
        base = 1.0 if self.backoff_base_s is None else self.backoff_base_s
        cap = 3600.0 if self.backoff_max_s is None else self.backoff_max_s
        return float(min(cap, base * 2 ** min(errors, 40)))


class RetryOptions(TypedDict, total=False):
    """``@app.handler(queue, **options)`` / ``@app.task``: see RetryPolicy."""

    max_attempts: int | None
    backoff_base_s: float | None
    backoff_max_s: float | None
    timeout_s: float | None
    retry_on: ExceptionTypes
    fail_on: ExceptionTypes


def policy_of(options: Mapping[str, Any]) -> RetryPolicy:
    unknown = set(options) - set(RetryOptions.__annotations__)
    if unknown:
        raise ConfigError(f"unknown handler option(s) {', '.join(sorted(unknown))}: use "
                          f"{', '.join(RetryOptions.__annotations__)}")
    values: dict[str, Any] = {k: tuple(v) if k in ("retry_on", "fail_on") and
                              isinstance(v, list) else v for k, v in options.items()}
    return RetryPolicy(**values)


@dataclass(frozen=True)
class Handler:
    queue: str
    fn: Callable[..., Any]
    is_async: bool
    payload_model: type[BaseModel] | None = None
    policy: RetryPolicy = RetryPolicy()


class Handlers:
    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.schedules: dict[str, Schedule] = {}
        self.hooks = Hooks()  # around every run

    def around(self, fn: Middleware) -> Middleware:
        """Middleware around every run: ``async def fn(job, call_next)``
        (a per-job context, a database session, timing)."""
        return self.hooks.around(fn)

    def on_end(self, fn: Callable[[RunEnd], Any]) -> Callable[[RunEnd], Any]:
        """Call ``fn(end)`` after every run with its outcome, duration and
        error (Sentry, metrics)."""
        return self.hooks.on_end(fn)

    def schedule(self, name: str, queue: str, *, cron: str | None = None,
                 every: float | None = None, timezone: str = "UTC",
                 payload: Any = None, overlap: str = "allow") -> None:
        """Declare a periodic job: a consumer of this app stores it in
        jobq.schedule at start; the reapers enqueue it once per slot
        (``overlap="skip"``: not while its last job is queued or running)."""
        try:
            self.schedules[name] = Schedule(name, queue, payload, cron, every, timezone,
                                            overlap=overlap)
        except (BadInput, TypeError) as exc:
            raise ConfigError(str(exc)) from exc

    def periodic(self, *, cron: str | None = None, every: float | None = None,
                 timezone: str = "UTC", payload: Any = None,
                 name: str | None = None, overlap: str = "allow") -> Callable[[F], F]:
        """Put over ``@app.handler(queue)``: also run that queue's handler on a
        schedule (named after the queue unless ``name`` is given)."""
        def register(fn: F) -> F:
            target = getattr(fn, "fn", fn)  # a typed task's function
            queue = next((h.queue for h in self.handlers.values() if h.fn is target), None)
            if queue is None:
                raise ConfigError("@app.periodic goes above @app.handler(queue)")
            self.schedule(name or queue, queue, cron=cron, every=every, timezone=timezone,
                          payload=payload, overlap=overlap)
            return fn

        return register

    def handler(
        self, queue: str, *, payload: type[BaseModel] | None = None,
        **retry: Unpack[RetryOptions],
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn`` for ``queue``; the retry options (RetryPolicy)
        override the queue's row for this handler's jobs."""
        try:
            check_queue_name(queue)
        except InvalidQueue as exc:
            raise ConfigError(str(exc)) from exc
        policy = policy_of(retry)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if queue in self.handlers:
                raise ConfigError(f"queue {queue!r} already has a handler")
            self.handlers[queue] = Handler(queue, fn, inspect.iscoroutinefunction(fn), payload,
                                           policy)
            return fn

        return register

    @property
    def queues(self) -> list[str]:
        return sorted(self.handlers)
