"""Every error jobq raises, in one tree.

::

    JobqError
    ├── ConfigError           bad settings or arguments (CLI exits 2)
    │   └── SchemaMissing     not migrated yet: services wait for `jobq migrate`
    ├── UnavailableError      a service cannot be reached right now
    │   ├── DatabaseUnavailable
    │   └── BrokerUnavailable
    ├── BadInput              the caller's data is wrong (CLI exits 1)
    │   ├── InvalidPayload    not JSON, too large, fails validation
    │   ├── InvalidQueue
    │   └── UnknownJob
    ├── LeaseLost             a fenced write matched zero rows: the job is no
    │                         longer ours (lapsed, reaped, cancelled)
    └── HandlerSignal         raised *by handlers* to say what they want
        ├── Retry             run again later (counts an attempt)
        ├── Fail              fail now, no more attempts
        ├── Snooze            run again later, no attempt counted
        ├── RateLimited       as Snooze, and hold the job's key fleet-wide
        └── Suspended         raised by job.sleep / job.wait_for: let it out
    SignalTimeout             job.wait_for's timeout passed with no signal

Driver exceptions (asyncpg, aio-pika) are translated only at the edges, in
``db.py``, ``broker_connect.py`` and ``broker.py``, with ``raise ... from exc``.
"""

from __future__ import annotations

import uuid
from typing import Any

MAX_DELAY_S = 365 * 86400.0  # the longest delay, retry or snooze jobq takes


class JobqError(Exception):
    """Base of everything jobq raises."""


class ConfigError(JobqError):
    pass


class SchemaMissing(ConfigError):
    """The database has no jobq schema yet. Services wait for it (migrations
    often run alongside the first start); the CLI says so and exits 2."""


class UnavailableError(JobqError):
    pass


class DatabaseUnavailable(UnavailableError):
    pass


class BrokerUnavailable(UnavailableError):
    pass


class BadInput(JobqError):
    pass


class InvalidPayload(BadInput):
    pass


class StepRefused(BadInput):
    """A durable step the database or the rules refuse (a name reused with
    another function, a result that cannot be stored, a bad name): the same
    on every run, so the job fails at once with it rather than retrying."""


class InvalidQueue(BadInput):
    pass


class UnknownJob(BadInput):
    pass


class DuplicateJob(BadInput):
    """A publish with ``on_duplicate="refuse"`` whose idempotency key is held:
    ``job_id`` is the job that holds it."""

    def __init__(self, message: str, job_id: uuid.UUID | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class LeaseLost(JobqError):
    """The lease on a job is gone; the worker must stop treating it as its own."""


class HandlerSignal(Exception):
    """Base for exceptions a handler raises on purpose."""


class Retry(HandlerSignal):
    """Retry the job after ``delay_s`` seconds (default: the queue's backoff)."""

    def __init__(self, reason: str = "retry requested", *, delay_s: float | None = None):
        # NaN or infinity once held the job's slot for good: refused here,
        # the handler's error is then an ordinary failure (its backoff).
        if delay_s is not None and (isinstance(delay_s, bool) or
                                    not isinstance(delay_s, int | float) or
                                    not 0 <= delay_s < MAX_DELAY_S):
            raise ValueError(f"Retry(delay_s=...) takes a finite number of seconds from 0 to "
                             f"under a year, got {delay_s!r}")
        super().__init__(reason)
        self.delay_s = delay_s


class Fail(HandlerSignal):
    """Fail the job now, without further attempts."""


MAX_CHUNKS = 10_000  # job.emit: the most chunks a job keeps (schema 0033)
MAX_SNOOZES = 100  # a job snoozed more often than this fails: nothing snoozes forever


class SignalInvalid(ValueError):
    """A handler signal built with bad arguments (a negative or NaN snooze):
    the job fails at once with this text; retrying would build it again."""


class Snooze(HandlerSignal):
    """Run the job again after ``seconds``, without counting an attempt or
    recording a failure (River's JobSnooze, Oban's {:snooze, s}). The job's
    ``snoozes`` count goes up; past MAX_SNOOZES the job fails."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not 0 <= seconds < MAX_DELAY_S:
            raise SignalInvalid(f"{type(self).__name__}(seconds) takes a finite number of "
                                f"seconds from 0 to under a year, got {seconds!r}")
        super().__init__(reason or f"snoozed {seconds:g} s")
        self.seconds = float(seconds)


class RateLimited(Snooze):
    """What an API said (HTTP 429, "try in 10 s"): the job is put back
    without being charged, like Snooze, and no job of its key (of its
    queue, when it has no key) starts anywhere in the fleet until then."""


class Suspended(HandlerSignal):
    """Raised by ``job.sleep`` and ``job.wait_for`` to end the run while the
    job waits (issue #52, I12): the consumer puts it back, no attempt
    counted, holding no slot and no lease, due at ``until`` (epoch seconds by
    the database clock; None: no timer) or when signal ``wake_on`` comes.
    A handler must let it propagate, as it would asyncio.CancelledError."""

    def __init__(self, until: float | None, wake_on: str | None, reason: str,
                 joining: list[Any] | None = None) -> None:
        super().__init__(reason)
        self.until = until
        self.wake_on = wake_on
        self.joining = joining  # job.join: the children's ids it waits for


class SignalTimeout(JobqError):
    """``job.wait_for(name, timeout_s=...)``: the time passed and no signal
    of that name came. Raised in the handler on the run after the timeout;
    uncaught, it is a failure like any other (retried per the queue)."""

    def __init__(self, name: str, timeout_s: float | None) -> None:
        super().__init__(f"no signal {name!r} within {timeout_s:g} s" if timeout_s is not None
                         else f"no signal {name!r}")
        self.name = name
