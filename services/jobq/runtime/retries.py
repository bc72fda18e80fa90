"""Retries declared next to a handler (issue #50, item 4): what
``@app.handler(queue, max_attempts=..., retry_on=..., ...)`` and
``@app.task`` take, checked once at import (one ConfigError line), and the
decision the worker asks of it per failure (worker/verdicts.py): whether an
exception may be retried at all. Attempts and backoff go with the failure to
the ``fail`` statement, which applies them over the queue's row (the
fleet-wide default for what a handler does not say): one backoff rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from jobq.errors import ConfigError

ExceptionTypes = tuple[type[BaseException], ...]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries declared next to a handler (issue #50, item 4), over its
    queue's row, which stays the fleet-wide default for what is not given:
    ``max_attempts`` (runs that may fail, this one included), a backoff of
    ``backoff_base_s * 2**errors`` capped at ``backoff_max_s`` (either one
    not given: the queue's), a
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

    def declared(self) -> dict[str, Any]:
        """What this policy sets (exception classes by name), for jobq queue list."""
        out: dict[str, Any] = {k: v for k in ("max_attempts", "backoff_base_s", "backoff_max_s",
                                              "timeout_s") if (v := getattr(self, k)) is not None}
        for k in ("retry_on", "fail_on"):
            if getattr(self, k):
                out[k] = [t.__name__ for t in getattr(self, k)]
        return out


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
