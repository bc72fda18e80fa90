"""A handler child process (``--pool process``): runs sync handlers, one job
at a time, for its parent consumer, and nothing else.

It never touches the database or the broker: the parent keeps claims, acks,
leases and heartbeats, and tells the child what to run over a socket
(``frames.py``: length-prefixed JSON, nothing pickled):

    parent → child   ["run", queue, job fields, max_result_bytes]   ["exit"]
    child → parent   ["ready", pid]   ["started"]
                     ["ok", result as JSON text or null]
                     ["error", kind, text, delay_s]
                     ["fatal", text]  (the app cannot be loaded)

The payload travels as the row's JSON text and is decoded and checked
against the handler's model here, in the child: a typed task's payload is a
pydantic model in the parent, which no frame can carry, and a payload nested
a thousand deep would overflow the parent's encoder (issue #47: either lost
a child and, twice, hung the consumer). ``started`` says the child has the
job: a child that dies before it is replaced and the job goes to another,
uncharged; one that dies after it is the job's own doing.

The result is checked against the queue's ``max_result_bytes`` here, before
it is sent: a 5 MB result over a 64 KiB limit fails its job with the reason
instead of crossing the socket.

The child dies with its parent (``PR_SET_PDEATHSIG``): a handler must never
outlive the process that holds its lease, or a job whose lease lapsed could
run twice at once.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import uuid
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from jobq.client.results import ResultInvalid, encode
from jobq.errors import Fail, RateLimited, Retry, SignalInvalid, Snooze
from jobq.job import Job
from jobq.runtime.validation import validation_failure
from jobq.telemetry import current
from jobq.worker import frames, tracebacks

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the socket's EOF still ends us when idle
        pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(0)


def describe(exc: BaseException) -> tuple[str, str, str, float | None, str | None]:
    """An exception as plain data the parent rebuilds (it may not unpickle),
    with its traceback formatted here, where its frames are."""
    tb = tracebacks.text_of(exc)
    if isinstance(exc, Snooze):  # RateLimited too: its kind says which
        return ("error", "rate_limited" if isinstance(exc, RateLimited) else "snooze",
                str(exc), exc.seconds, tb)
    if isinstance(exc, SignalInvalid):
        return ("error", "invalid", str(exc), None, tb)
    if isinstance(exc, Retry):
        return ("error", "retry", str(exc), exc.delay_s, tb)
    if isinstance(exc, Fail):
        return ("error", "fail", str(exc), None, tb)
    if isinstance(exc, ValidationError):
        return ("error", "other", f"ValidationError: {exc}", None, tb)
    text = str(exc)
    return ("error", "other", f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
            None, tb)


def rebuild(fields: dict[str, Any], payload: Any) -> Job:
    """The Job from its JSON fields (ids and times travel as text)."""
    created = fields.get("created_at")
    return Job(id=uuid.UUID(fields["id"]), queue=fields["queue"], payload=payload,
               attempt=fields["attempt"], lock=uuid.UUID(fields["lock"]),
               worker_id=fields["worker_id"], stalls=fields["stalls"],
               created_at=datetime.fromisoformat(created) if created else None)


def payload_of(handler: Any, queue: str, text: str) -> Any:
    """The payload as the handler takes it; Fail if it cannot be (the same
    on every run: no retry helps)."""
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Fail(f"payload cannot be decoded: {type(exc).__name__}: {str(exc)[:200]}") from None
    if handler.payload_model is None:
        return payload
    try:
        return handler.payload_model.model_validate(payload)
    except ValidationError as exc:
        raise Fail(validation_failure(queue, exc)) from None
    except RecursionError:
        raise Fail("payload cannot be decoded: nested too deep for its model") from None


def run_one(app: Any, queue: str, fields: dict[str, Any], max_result_bytes: int) -> list[Any]:
    """Run one job's handler; the reply to send."""
    handler = None
    try:
        handler = app.named(queue, fields.get("task"))
        job = rebuild(fields, payload_of(handler, queue, fields["payload_text"]))
        with current.running(job, job.worker_id, fields.get("trace_id")):
            value = handler.fn(job)
        return ["ok", encode(value, max_result_bytes)]
    except ResultInvalid as exc:
        return ["error", "fail", str(exc), None, None]
    except BaseException as exc:
        reply = list(describe(exc))
        refused = (handler.policy.refused(exc)
                   if handler is not None and reply[1] == "other" else None)
        if refused:  # the handler's retry rules need the class: decided here
            reply[1] = f"refused:{refused}"
        return reply


def serve(app_spec: str, sock: socket.socket) -> None:
    from jobq.app import load

    try:
        app = load(app_spec)
    except Exception as exc:
        frames.send(sock, ["fatal", str(exc)])
        return
    frames.send(sock, ["ready", os.getpid()])
    while True:
        try:
            msg = frames.recv(sock)
        except (EOFError, OSError):
            return  # the parent is gone
        if msg[0] == "exit":
            return
        _, queue, fields, max_result_bytes = msg
        frames.send(sock, ["started"])
        frames.send(sock, run_one(app, queue, fields, max_result_bytes))


def main() -> None:
    app_spec, fd, parent_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    serve(app_spec, sock)


if __name__ == "__main__":
    main()
