"""``async for item in client.stream(job_id, from_offset=0)``: a job's
streamed output, in order, as its handler emits it (issue #52, item 5;
schema 0033).

Items are :class:`Chunk` (``offset``, ``data``, the ``attempt`` that emitted
it) and, before the first chunk of a run after another run's chunks (a
re-run after a crash, a wake), one :class:`RunBoundary`. The stream ends
once the job ended and every chunk was given; resume after a disconnect
with ``from_offset`` = the last chunk's offset.

One client LISTENs on ``jobq_output`` on one connection, whatever the
number of its streams (:class:`Listener`): an emit's NOTIFY wakes that
job's readers at once, and each reads the rows, the truth, on a pooled
connection held for the read alone — so a thousand readers cost one
listening session, not a thousand. A notification is a hint any login
could send, and one can be missed (the listening session reconnecting):
a reader also re-reads every ``RECHECK_S``. Readers only read: none can
hold up a worker (I11).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from jobq.client.results import job_uuid
from jobq.client.store import output_read
from jobq.db import connection
from jobq.errors import UnknownJob
from jobq.status import TERMINAL

log = logging.getLogger("jobq.client")

RECHECK_S = 1.0
BATCH = 500  # chunks a read returns at most


@dataclass(frozen=True, slots=True)
class Chunk:
    """One emitted chunk: its offset (1, 2, ...), what was emitted, by which attempt."""

    offset: int
    data: Any
    attempt: int


@dataclass(frozen=True, slots=True)
class RunBoundary:
    """The chunks after this one come from a later run of the job (``attempt``)."""

    attempt: int


class Listener:
    """One LISTEN jobq_output session for all of a client's streams."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.waiting: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._up = asyncio.Event()
        self._stop = asyncio.Event()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        for event in self.waiting.get(str(payload), ()):
            event.set()

    async def _listen(self) -> None:
        try:
            async with connection(self.pool) as conn:
                await conn.add_listener("jobq_output", self._notified)
                self._up.set()
                await self._stop.wait()
                await conn.remove_listener("jobq_output", self._notified)
        except Exception as exc:  # readers go on on their re-reads; the next starts it again
            log.debug("stream listener: %r", exc)
        finally:
            self._up.clear()

    async def started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="jobq-stream-listener")
        with contextlib.suppress(TimeoutError):  # not up in time: the re-reads cover it
            await asyncio.wait_for(self._up.wait(), 5)

    @contextlib.contextmanager
    def watching(self, job_id: uuid.UUID) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self.waiting.setdefault(str(job_id), set()).add(event)
        try:
            yield event
        finally:
            left = self.waiting[str(job_id)]
            left.discard(event)
            if not left:
                del self.waiting[str(job_id)]

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5)


async def stream(pool: Any, listener: Listener, job_id: uuid.UUID,
                 from_offset: int = 0) -> AsyncIterator[Chunk | RunBoundary]:
    if isinstance(from_offset, bool) or not isinstance(from_offset, int) or from_offset < 0:
        raise ValueError(f"from_offset is a chunk's offset (0: from the start), "
                         f"got {from_offset!r}")
    job_id = job_uuid(job_id)  # UnknownJob for what is not a job id
    await listener.started()
    offset, run = from_offset, None
    with listener.watching(job_id) as woken:
        while True:
            woken.clear()  # before the read: an emit after it sets it again
            row = await output_read(pool, job_id, offset, BATCH)
            if row is None:
                raise UnknownJob(f"no job {job_id} (or it was pruned)")
            chunks = json.loads(row["chunks"])
            for c in chunks:
                if run is not None and c["run"] != run:
                    yield RunBoundary(c["attempt"])
                run, offset = c["run"], c["n"]
                yield Chunk(c["n"], c["chunk"], c["attempt"])
            if len(chunks) == BATCH:
                continue  # more to read now
            if row["status"] in TERMINAL:
                return  # read after the status: every chunk was given
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), RECHECK_S)
