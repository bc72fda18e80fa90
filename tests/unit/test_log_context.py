"""A handler's own log records carry its job (issue #32): jobq.telemetry.logs.setup's
filter adds the running job's fields to every record, text or JSON; outside
a job nothing is added; without a tracer provider nothing is traced."""

from __future__ import annotations

import io
import json
import logging
import uuid
from typing import Any

import jobq
from jobq.telemetry import current, logs, tracing

JOB: jobq.Job[Any] = jobq.Job(id=uuid.UUID(int=7), queue="emails", payload={}, attempt=2,
               lock=uuid.uuid4(), worker_id="w1")


def _line(as_json: bool, inside: bool) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs._JsonFormatter() if as_json else logs._TextFormatter())
    handler.addFilter(current.JobContextFilter())
    log = logging.getLogger(f"myapp.{uuid.uuid4()}")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    if inside:
        with current.running(JOB, "w1", "ab" * 16):
            log.info("sent", extra=logs.fields(to="a@b.c"))
    else:
        log.info("sent")
    return out.getvalue().strip()


def test_text_and_json_lines_carry_the_running_job() -> None:
    assert _line(False, True).endswith(
        f"job={JOB.id} queue=emails attempt=2 worker=w1 "
        f"trace_id={'ab' * 16} to=a@b.c")
    doc = json.loads(_line(True, True))
    assert (doc["job"], doc["queue"], doc["attempt"], doc["to"]) == (str(JOB.id), "emails", 2,
                                                                    "a@b.c")


def test_outside_a_job_nothing_is_added() -> None:
    assert _line(False, False).endswith("sent")
    assert jobq.job_context() == {}
    with current.running(JOB, "w1"):
        assert jobq.job_context()["job"] == str(JOB.id)
    assert jobq.job_context() == {}


def test_no_trace_is_stored_outside_a_span() -> None:
    assert tracing.carrier() is None and tracing.trace_id() is None
