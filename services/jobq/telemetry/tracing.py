"""OpenTelemetry, with the ``jobq[otel]`` extra: a job's run is a span in the
trace of the code that published it.

The publisher's trace context (W3C ``traceparent``/``tracestate``, as the
configured propagator writes it) is stored beside the job in
``jobq.job_trace`` in the statement that inserts the job; the consumer reads
it before the handler runs and opens a ``jobq.run`` span (kind CONSUMER) as
its child, with the job's id, queue, attempt and worker, and the outcome when
it ends. Spans the handler opens are children of that span. A job enqueued
from SQL or fired by a schedule has no stored context and starts a trace of
its own; a retry or a re-run after a crash is a new span of the same trace,
since every run reads the same stored context.

Zero cost without the extra, and nearly none with it until a tracer provider
is configured: nothing is stored for a publish outside a recording span, and
a consumer with no provider (OpenTelemetry's default proxy) reads nothing.
A ``--pool process`` handler runs in a child, outside the span (its
duration and outcome are still the span's).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

try:
    import opentelemetry.context as otel_context
    import opentelemetry.propagate as propagate
    import opentelemetry.trace as trace

    INSTALLED = True
except ImportError:  # the extra is not installed: every function here is a no-op
    INSTALLED = False

log = logging.getLogger("jobq.consumer")

MAX_CARRIER_BYTES = 4096  # jobq.job_trace's CHECK: a header set, not a payload


_seen = {"on": False}
# A provider named in the environment is made on the first get_tracer_provider().
_FROM_ENV = bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))


def enabled() -> bool:
    """True when OpenTelemetry is installed and a tracer provider is set.
    Called once a job: a set provider stays set (OpenTelemetry sets it once).
    While none is set, get_tracer_provider() reads os.environ on every call
    (~1 % of a no-op job's consumer CPU, py-spy, issue #49): the module's
    global says as much without it (the full look where it is missing)."""
    if not INSTALLED:
        return False
    if _seen["on"]:
        return True
    if getattr(trace, "_TRACER_PROVIDER", "?") is None and not _FROM_ENV:
        return False
    provider = trace.get_tracer_provider()
    _seen["on"] = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return _seen["on"]


def carrier() -> str | None:
    """The current trace context as a JSON object, or None outside a span."""
    if not INSTALLED or not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    propagate.inject(headers)
    text = json.dumps(headers)
    return text if headers and len(text) <= MAX_CARRIER_BYTES else None


def _ignore(outcome: str) -> None:
    return None


@contextmanager
def run_span(job: Any, stored: str | None, worker: str) -> Iterator[Callable[[str], None]]:
    """The ``jobq.run`` span of one run of ``job``; yields a setter of its
    outcome. ``stored``: the publisher's carrier (None: a trace of its own)."""
    if not enabled():
        yield _ignore
        return
    parent = _parent(job, stored)
    tracer = trace.get_tracer("jobq")
    attributes = {"jobq.job_id": str(job.id), "jobq.queue": job.queue,
                  "jobq.attempt": job.attempt, "jobq.worker": worker,
                  "messaging.system": "jobq", "messaging.destination.name": job.queue}
    with tracer.start_as_current_span("jobq.run", context=parent, kind=trace.SpanKind.CONSUMER,
                                      attributes=attributes,
                                      record_exception=False) as span:
        def outcome(label: str) -> None:
            span.set_attribute("jobq.outcome", label)
            if label != "ok":
                span.set_status(trace.Status(trace.StatusCode.ERROR, label))

        yield outcome


def _parent(job: Any, stored: str | None) -> Any:
    """The publisher's context from its carrier; a fresh one (and one
    warning) if it cannot be read: telemetry never fails a job (I11: a
    carrier {"traceparent": 5} made a job fail and come back forever)."""
    if not stored:
        return otel_context.Context()
    try:
        headers = json.loads(stored)
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise ValueError("not an object of string headers")
        return propagate.extract(headers)
    except Exception as exc:
        log.warning("job %s: its trace context cannot be read (%s: %s); the run starts a "
                    "trace of its own", job.id, type(exc).__name__, str(exc)[:100])
        return otel_context.Context()


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits), for log records."""
    if not INSTALLED:
        return None
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None
