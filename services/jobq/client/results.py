"""Results: a handler's return value, stored with the completion by the same
fenced statement (so a zombie's result never replaces the owner's), and the
wait for it (issue #17).

A result is JSON (a pydantic model is dumped in JSON mode), at most the
queue's ``max_result_bytes``; a handler returning something else fails its
job with the reason, at once (retrying would return the same). ``wait``
watches the job (a row of its own in ``jobq.job_watch``), then sleeps on
LISTEN ``jobq_finished``: only a watched job's end sends a NOTIFY (trigger
in schema 0024). The job's row is never written by a waiter (I11: a waiter
in an open transaction held its lock, and its worker's renewals waited).
The price: an end whose trigger looked just before the watch was committed
and that committed just after the waiter's read sends nothing, so the
waiter also re-reads the row every ``RECHECK_S``: that rare end is seen
within it, every other one at once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from pydantic import BaseModel

from jobq.client import store
from jobq.client.store import JobState
from jobq.db import connection
from jobq.errors import JobqError, UnknownJob
from jobq.status import TERMINAL

RECHECK_S = 2.0  # a waiter re-reads the row this often, NOTIFY or not


class JobFailed(JobqError):
    """The job ended without a result: failed or cancelled."""

    def __init__(self, job_id: uuid.UUID, status: str, error: str | None,
                 traceback: str | None = None) -> None:
        super().__init__(f"job {job_id} {status}: {error or 'no reason recorded'}")
        self.job_id, self.status, self.error = job_id, status, error
        self.traceback = traceback  # where the handler's last failure was raised


class ResultInvalid(Exception):
    """The handler's return value cannot be stored (not JSON, too large)."""


def encode(value: Any, limit: int) -> str | None:
    """The result as JSON text (None for None); ResultInvalid if it cannot be."""
    if value is None:
        return None
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ResultInvalid(f"the handler's return value is not JSON ({exc}); return a "
                            "dict, list, str, number, bool or pydantic model") from None
    size = len(text)  # json.dumps escapes non-ASCII: characters are bytes
    if size > limit:
        raise ResultInvalid(f"the result is {size} bytes, over the queue's "
                            f"max_result_bytes of {limit}; store it elsewhere and return a "
                            "reference")
    return text


def _outcome(row: JobState) -> Any:
    if row.status == "completed":
        return json.loads(row.result) if row.result is not None else None
    raise JobFailed(row.id, row.status, row.last_error, row.last_traceback)


def job_uuid(job_id: object) -> uuid.UUID:
    """A job id as given (a UUID or its text); UnknownJob for anything else,
    rather than the driver's error about a malformed value."""
    if isinstance(job_id, uuid.UUID):
        return job_id
    try:
        return uuid.UUID(str(job_id))
    except ValueError:
        raise UnknownJob(f"no job {str(job_id)[:100]!r}: not a job id") from None


async def wait(pool: Any, job_id: uuid.UUID,
               timeout: float | None) -> Any:  # noqa: ASYNC109 (client.result(timeout=))
    """The job's result once it completed; JobFailed if it failed or was
    cancelled; TimeoutError after ``timeout`` seconds; jobq.UnknownJob if
    there is no such job (or ``job_id`` is not a job id)."""
    job_id = job_uuid(job_id)
    ended = asyncio.Event()

    def on_notify(_conn: Any, _pid: int, _channel: str, payload: object) -> None:
        if payload == str(job_id):
            ended.set()

    timed_out = False
    async with connection(pool) as conn:
        await conn.add_listener("jobq_finished", on_notify)
        try:
            row = await store.watch(conn, job_id)
            if row is None:
                raise UnknownJob(f"no job {job_id}")
            # A notification is a hint, not the answer: any login may NOTIFY
            # jobq_finished with any id. Re-read the row, and wait on unless
            # it is terminal, until the deadline.
            deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
            while row.status not in TERMINAL:
                left = None if deadline is None else deadline - asyncio.get_running_loop().time()
                if left is not None and left <= 0:
                    timed_out = True  # raised outside: connection() would call it an outage
                    break
                try:
                    await asyncio.wait_for(ended.wait(), RECHECK_S if left is None
                                           else min(left, RECHECK_S))
                except TimeoutError:
                    pass  # read it again: the rare end that sent nothing (above)
                ended.clear()  # before the re-read: an end after it sets it again
                row = await store.watch(conn, job_id)  # (a producer reads no row)
                if row is None:  # pruned meanwhile
                    raise UnknownJob(f"no job {job_id}")
        finally:
            await conn.remove_listener("jobq_finished", on_notify)
    if timed_out:
        raise TimeoutError(f"job {job_id} did not end within {timeout}s")
    return _outcome(row)
