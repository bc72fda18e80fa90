"""The job the running code works for, for handlers' own log records.

While a consumer runs a handler (async, in its thread pool, or in a
``--pool process`` child), :func:`job_context` returns the job's id, queue,
attempt, worker and, with OpenTelemetry, its trace id; outside a job it is
empty. ``jobq.telemetry.logs.setup`` adds these fields to every record logged during
the job (``logging.getLogger("myapp").info("sent")`` then carries
``job=… queue=…``). With logging set up your own way, add
:class:`JobContextFilter` to your handler; with structlog, a processor::

    def add_job(logger, method, event):
        event.update(jobq.job_context())
        return event
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "jobq_job", default=None)


def job_context() -> dict[str, Any]:
    """The running job's fields (a copy), or ``{}`` outside a job."""
    fields = _current.get()
    return dict(fields) if fields else {}


@contextmanager
def running(job: Any, worker: str, trace_id: str | None = None) -> Iterator[None]:
    """Within this block (and tasks and copied contexts started in it) the
    job is the current one."""
    fields: dict[str, Any] = {"job": str(job.id), "queue": job.queue, "attempt": job.attempt,
                              "worker": worker}
    if trace_id:
        fields["trace_id"] = trace_id
    token = _current.set(fields)
    try:
        yield
    finally:
        _current.reset(token)


class JobContextFilter(logging.Filter):
    """Adds the running job's fields to a record: to jobq's own ``f`` field
    map (what jobq's formatters print) and as ``record.jobq`` (a dict)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _current.get()
        if fields:
            record.jobq = fields
            own = getattr(record, "f", None)
            record.f = {**fields, **own} if own else dict(fields)
        return True
