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
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, Unpack

from pydantic import BaseModel

from jobq.errors import BadInput, ConfigError, Fail, InvalidQueue
from jobq.job import Job
from jobq.queues import check_queue_name
from jobq.runtime.retries import RetryOptions, RetryPolicy, policy_of
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

    async def run(self, job: Job, handler: Callable[[], Awaitable[Any]]) -> Any:
        """call() then ended(), as a consumer runs a job: jobq.testing's way."""
        started, outcome, error = time.monotonic(), "ok", None
        try:
            return await self.call(job, handler)
        except BaseException as exc:
            outcome, error = "error", exc
            raise
        finally:
            await self.ended(RunEnd(job, outcome, time.monotonic() - started, error))

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


@dataclass(frozen=True)
class Handler:
    queue: str
    fn: Callable[..., Any]
    is_async: bool
    payload_model: type[BaseModel] | None = None
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    task: str | None = None  # its name, where several tasks share the queue


def envelope(task: str, payload: Any) -> dict[str, Any]:
    """A named task's job as its row holds it: which task, and its payload."""
    return {"task": task, "payload": payload}


async def _routed(job: Any) -> None:  # the queue's entry while its tasks are named
    raise Fail(f"queue {job.queue} runs named tasks: publish with a task name")


class Handlers:
    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        # Several named tasks on one queue (issue #50, item 3): the row's
        # payload is an envelope {"task": name, "payload": ...} (envelope()),
        # and route() picks the task's handler per job; limits and priorities
        # stay the queue's.
        self.tasks: dict[str, dict[str, Handler]] = {}
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
            mine = [h for h in (*self.handlers.values(),
                                *(t for ts in self.tasks.values() for t in ts.values()))
                    if h.fn is target]
            if not mine:
                raise ConfigError("@app.periodic goes above @app.handler(queue)")
            h = mine[0]
            self.schedule(name or h.task or h.queue, h.queue, cron=cron, every=every,
                          timezone=timezone, overlap=overlap,
                          payload=payload if h.task is None else envelope(h.task, payload))
            return fn

        return register

    def handler(
        self, queue: str, *, payload: type[BaseModel] | None = None, task: str | None = None,
        **retry: Unpack[RetryOptions],
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn`` for ``queue`` (or, with ``task``, for that task's
        jobs on ``queue``, beside other named tasks); the retry options
        (RetryPolicy) override the queue's row for this handler's jobs."""
        try:
            check_queue_name(queue)
            if task is not None:
                check_queue_name(task)
        except InvalidQueue as exc:
            raise ConfigError(str(exc).replace("queue name", "task name")) from exc
        policy = policy_of(retry)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            made = Handler(queue, fn, inspect.iscoroutinefunction(fn), payload, policy, task)
            named = self.tasks.get(queue)
            if task is None:
                if queue in self.handlers:
                    raise ConfigError(f"queue {queue!r} already has a handler"
                                      + (" per named task: name this one too (task=...)"
                                         if named is not None else ""))
                self.handlers[queue] = made
            else:
                if queue in self.handlers and named is None:
                    raise ConfigError(f"queue {queue!r} has a handler for all its jobs: "
                                      "name every handler of a queue that tasks share")
                if task in (named or {}):
                    raise ConfigError(f"task {task!r} of queue {queue!r} already has a handler")
                self.tasks.setdefault(queue, {})[task] = made
                self.handlers[queue] = Handler(queue, _routed, True)
            return fn

        return register

    def route(self, queue: str, payload_text: str) -> tuple[Handler, str]:
        """The handler of one job of ``queue`` and the payload it gets: the
        queue's own, or, where tasks are named, the one the row's envelope
        names (an unknown or missing name: a handler that fails the job at
        once, saying which tasks this app has)."""
        tasks = self.tasks.get(queue)
        if tasks is None:
            return self.handlers[queue], payload_text
        try:
            doc = json.loads(payload_text)
        except (ValueError, RecursionError):
            doc = None
        name = doc.get("task") if isinstance(doc, dict) else None
        found = tasks.get(name) if isinstance(name, str) else None
        if found is None:
            return Handler(queue, _unknown(queue, name, sorted(tasks)), True,
                           task=str(name)[:100]), payload_text
        assert isinstance(doc, dict)  # a name was found in it
        return found, json.dumps(doc.get("payload"))

    def declared(self) -> str | None:
        """The retry options the handlers declare, as JSON: {queue: {task or
        "*": {option: value}}}, only what they set (None: nothing)."""
        out: dict[str, dict[str, Any]] = {}
        for table in (self.handlers, *self.tasks.values()):
            for h in table.values():
                said = h.policy.declared()
                if said:
                    out.setdefault(h.queue, {})[h.task or "*"] = said
        return json.dumps(out, sort_keys=True) if out else None

    def named(self, queue: str, task: str | None) -> Handler:
        """A handler by queue and task name (a child process gets both)."""
        return self.tasks[queue][task] if task is not None else self.handlers[queue]

    @property
    def queues(self) -> list[str]:
        """Every queue this app handles (a queue of named tasks once)."""
        return sorted(self.handlers)


def _unknown(queue: str, name: object, known: list[str]) -> Callable[..., Any]:
    async def fail(_job: Any) -> None:
        raise Fail(f"unknown task {name!r} on queue {queue}: this app runs "
                   f"{', '.join(known)} there (publish with one of those task names)")
    return fail
