"""A handler child process (``--pool process``): runs sync handlers, one job
at a time, for its parent consumer, and nothing else.

It never touches the database or the broker: the parent keeps claims, acks,
leases and heartbeats, and tells the child what to run over a socket
(``multiprocessing.connection`` framing, pickled tuples):

    parent → child   ("run", queue, job fields)   ("exit",)
    child → parent   ("ready", pid)   ("ok",)   ("error", kind, text, delay_s)
                     ("fatal", text)  (the app cannot be loaded)

The child dies with its parent (``PR_SET_PDEATHSIG``): a handler must never
outlive the process that holds its lease, or a job whose lease lapsed could
run twice at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any

from pydantic import ValidationError

from jobq.errors import Fail, Retry
from jobq.job import Job

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the socket's EOF still ends us when idle
        pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(0)


def describe(exc: BaseException) -> tuple[str, str, str, float | None]:
    """An exception as plain data the parent rebuilds (it may not unpickle)."""
    if isinstance(exc, Retry):
        return ("error", "retry", str(exc), exc.delay_s)
    if isinstance(exc, Fail):
        return ("error", "fail", str(exc), None)
    if isinstance(exc, ValidationError):
        return ("error", "other", f"ValidationError: {exc}", None)
    text = str(exc)
    return ("error", "other", f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
            None)


def serve(app_spec: str, conn: Connection) -> None:
    from jobq.app import load

    try:
        app = load(app_spec)
    except Exception as exc:
        conn.send(("fatal", str(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if msg[0] == "exit":
            return
        _, queue, job_fields = msg
        job = Job(**job_fields)
        try:
            reply: tuple[Any, ...] = ("ok", app.handlers[queue].fn(job))  # the result
        except BaseException as exc:
            reply = describe(exc)
        try:
            conn.send(reply)
        except Exception as exc:  # a result that cannot be pickled
            conn.send(("error", "fail", f"the handler's return value cannot be sent to the "
                       f"parent: {type(exc).__name__}: {exc}", None))


def main() -> None:
    app_spec, fd, parent_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sock = socket.socket(fileno=fd)
    serve(app_spec, Connection(sock.detach()))


if __name__ == "__main__":
    main()
