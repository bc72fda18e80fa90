"""Publishing: the row first, then the id on the exchange.

The row is committed before the id is published, so a consumer can never
receive an id whose row it cannot see. If the process dies between the commit
and the broker's confirm, the row is left with ``published_at IS NULL`` and
the reaper's relay publishes it once ``relay_after`` (a short grace) passes.
Inside a caller's own transaction, :meth:`Client.enqueue` only inserts: the
id is published by the relay when (and only if) the caller commits, because
``jobq.enqueue`` NOTIFYs the reapers and NOTIFY is delivered at commit.
``publish_many(..., relay=True)`` (bulk) hands its ids to the relay the
same way, and returns at the commit.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import asyncpg
from typing_extensions import Unpack

from jobq.amqp.broker import Broker
from jobq.client import store
from jobq.client.publish import publish_and_mark
from jobq.client.publisher import Marks, Rows, Sends, publish
from jobq.client.workflow import Workflow, enqueue_linked, enqueue_one
from jobq.db import open_pool, translated
from jobq.errors import InvalidPayload
from jobq.newjob import JobOptions, NewJob, new_job, validate
from jobq.queues import BY_COLUMN
from jobq.runtime import crash
from jobq.settings import Settings
from jobq.telemetry import tracing

if TYPE_CHECKING:
    from jobq.client.stream import Chunk, Listener, RunBoundary

log = logging.getLogger("jobq.client.producer")

LIMITS_TTL_S = 60.0
MARK_DELAY_S = 0.25  # publisher.Marks: how long confirmed ids wait for their mark
CHECK_OVER_BYTES = 65536
DEFAULT_PAYLOAD_LIMIT = int(BY_COLUMN["max_payload_bytes"].default)


class Client:
    """Publishes jobs. ``async with Client() as c: await c.publish("q", {...})``."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.pool: asyncpg.Pool | None = None
        self._rows: Rows | None = None
        self._marks: Marks | None = None
        self._sends: Sends | None = None
        self._direct: asyncpg.Pool | None = None  # result waits behind PgBouncer
        self._listener: Listener | None = None  # client.stream's one LISTEN session
        self._limits: dict[str, tuple[int, float]] = {}  # queue -> (max_payload_bytes, read at)
        self.broker = Broker(self.settings.amqp_url, self.settings.namespace,
                             self.settings.amqp_heartbeat_s)

    async def connect(self, *, wait: bool = False) -> None:
        self.pool = await open_pool(self.settings.database_url, wait=wait, app_name="jobq-producer",
                                    pooled=self.settings.database_pooled)
        try:
            await self.broker.connect(wait=wait)
        except BaseException:
            await self.pool.close()
            raise
        self._rows = Rows(self.pool, self.settings.producer.relay_grace_s)
        # Marks wait a while (a claimed row needs none), but well inside the
        # grace after which the relay publishes an unmarked row itself.
        grace = self.settings.producer.relay_grace_s
        self._marks = Marks(self.pool, delay_s=min(MARK_DELAY_S, grace / 4))
        self._sends = Sends(self.broker)

    async def close(self) -> None:
        if self._marks is not None:
            await self._marks.close()
        await self.broker.close()
        if self._listener is not None:
            await self._listener.close()
        if self._direct is not None:
            await self._direct.close()
        if self.pool is not None:
            await self.pool.close()

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(self, queue: str, payload: Any = None,
                      **options: Unpack[JobOptions]) -> uuid.UUID:
        """Enqueue one job and publish its id; returns the job id (with
        ``debounce_s``, the id of the pending job it joined, if any). Options:
        :class:`jobq.newjob.JobOptions` (``after``: it runs once each of those
        jobs completed)."""
        (job_id,) = await self.publish_many([new_job(queue, payload, options)])
        return job_id

    async def publish_many(self, jobs: Iterable[NewJob], *,
                           relay: bool = False) -> list[uuid.UUID]:
        """Enqueue many jobs in one transaction (shared with concurrent
        publishes of this client), then publish their ids.

        ``relay=True`` (bulk enqueue): return once the rows are committed;
        the reapers' relay publishes the ids, woken by NOTIFY at the commit,
        at the broker's pace. The call then costs the database's time, not
        one confirmed message per job; the jobs start a little later, and
        only while a reaper runs (as SQL-only enqueues)."""
        jobs = list(jobs)
        payloads = [validate(j) for j in jobs]
        assert self.pool is not None, "call connect() first"
        await self._check_sizes(jobs, payloads)
        assert self._rows is not None and self._marks is not None
        grace = 0.0 if relay else self.settings.producer.relay_grace_s  # 0: the relay's
        trace = tracing.carrier()  # the caller's span, if any: the runs' parent
        if any(j.linked for j in jobs):  # one transaction, jobs in order (workflow.py)
            ids = await enqueue_linked(self.pool, jobs, payloads, grace)
        elif relay:  # a transaction of its own, not the group commit's grace
            ids = await self._rows.commit(Rows.of(jobs, payloads, trace), 0.0)
        else:
            ids = await self._rows.insert(Rows.of(jobs, payloads, trace))
        crash.point("producer.after_commit")
        if relay:
            return ids
        held: set[uuid.UUID] = set()
        if any(j.key is not None for j in jobs):  # a per-key cap may have parked some
            try:
                held = await store.held_back(self.pool, ids)
            except Exception as exc:  # committed: publish all, the claim decides
                log.debug("held_back: %r", exc)
        assert self._sends is not None
        await publish(self._sends, self._marks,
                      [(i, j.queue) for i, j in zip(ids, jobs) if not j.waits and i not in held])
        return ids

    async def publish_workflow(self, workflow: Workflow) -> uuid.UUID:
        """Publish every step of ``workflow`` in one transaction; returns its
        id (``jobq inspect`` / ``jobq cancel`` take it). Steps that wait for
        none start now; each other one when the last it waits for completed."""
        ids = await self.publish_many(workflow.jobs())
        workflow.bind(ids)
        return workflow.id

    async def _check_sizes(self, jobs: Sequence[NewJob], payloads: Sequence[str]) -> None:
        """Refuse a large payload clearly over its queue's max_payload_bytes
        before it crosses the wire (a 50 MB payload used to, to be refused by
        the database). Payloads under CHECK_OVER_BYTES cost nothing here (no
        lookup on the hot path; the database checks them exactly, as it does
        all). Limits are read once per queue and kept LIMITS_TTL_S; 5 %
        tolerance because jsonb's text can differ a little from json.dumps.
        ``validate`` gives ASCII (json.dumps escapes the rest): len() is bytes."""
        big = [(j, t) for j, t in zip(jobs, payloads) if len(t) > CHECK_OVER_BYTES]
        if not big:
            return
        assert self.pool is not None
        now = time.monotonic()
        stale = {j.queue for j, _ in big
                 if j.queue not in self._limits or now - self._limits[j.queue][1] > LIMITS_TTL_S}
        if stale:
            found = await store.payload_limits(self.pool, sorted(stale))
            for q in stale:  # a queue created by this publish gets the default
                self._limits[q] = (found.get(q, DEFAULT_PAYLOAD_LIMIT), now)
        for job, text in big:
            limit = self._limits[job.queue][0]
            size = len(text)
            if size > limit * 1.05:
                raise InvalidPayload(f"payload is {size} bytes, over the {limit} byte limit of "
                                     f"queue {job.queue}; store large data elsewhere and pass a "
                                     "reference, or raise jobq.queue.max_payload_bytes")

    async def republish(self, rows: Sequence[tuple[uuid.UUID, str, uuid.UUID | None]]) -> None:
        """Publish ids of rows put back in line (id, queue, lock token)."""
        assert self.pool is not None
        await publish_and_mark(self.broker, self.pool, rows)

    async def result(self, job_id: uuid.UUID,
                     timeout: float | None = None) -> Any:  # noqa: ASYNC109 (the API asked for)
        """Wait for the job to end: its result (the handler's return value),
        or :class:`jobq.JobFailed` if it failed or was cancelled, or
        TimeoutError. Woken by NOTIFY at the job's end, no polling."""
        from jobq.client.results import wait

        return await wait(await self._listening(), job_id, timeout)

    async def _listening(self) -> asyncpg.Pool:
        """Where a LISTEN works: the pool, or behind a pooler a session of its own."""
        assert self.pool is not None, "call connect() first"
        if self.settings.database_pooled:
            if self._direct is None:
                self._direct = await open_pool(self.settings.session_url, wait=False,
                                               max_size=2, app_name="jobq-producer-results")
            return self._direct
        return self.pool

    async def stream(self, job_id: uuid.UUID,
                     from_offset: int = 0) -> AsyncGenerator[Chunk | RunBoundary, None]:
        """The job's output (``job.emit``) in order, as it is emitted:
        :class:`jobq.Chunk` items, a :class:`jobq.RunBoundary` where a later
        run's chunks start; it ends once the job ended and all were given.
        Resume with ``from_offset`` = the last chunk's offset."""
        from jobq.client.stream import Listener, stream

        assert self.pool is not None, "call connect() first"
        if self._listener is None:
            self._listener = Listener(await self._listening())
        async for item in stream(self.pool, self._listener, job_id, from_offset):
            yield item

    async def signal(self, job_id: uuid.UUID, name: str, payload: Any = None, *,
                     conn: asyncpg.Connection | None = None) -> bool:
        """Send signal ``name`` with ``payload`` (JSON) to a job: a handler's
        ``job.wait_for(name)`` returns it, now or in a later run. True if kept,
        False if one of that name was sent before (the first is kept). With
        ``conn``, inside the caller's open transaction: the job is woken only
        if it commits. :class:`jobq.UnknownJob` for no such job,
        :class:`jobq.errors.BadInput` for one that ended."""
        text = validate(NewJob("signal", payload))
        if conn is not None:
            return await store.signal(conn, uuid.UUID(str(job_id)), name, text)
        assert self.pool is not None, "call connect() first"
        return await store.signal(self.pool, uuid.UUID(str(job_id)), name, text)

    async def enqueue(self, conn: asyncpg.Connection, queue: str, payload: Any = None,
                      **options: Unpack[JobOptions]) -> uuid.UUID:
        """Insert a job inside the caller's open transaction (``conn``).

        Nothing is published now: the reapers publish the id right after the
        caller commits (woken by NOTIFY), and never if it rolls back. With
        ``after``, once each of those jobs completed.
        """
        job = new_job(queue, payload, options, "enqueue")
        payload_json = validate(job)
        if job.linked:  # after or a deadline: through jobq.enqueue
            with translated():
                return await enqueue_one(conn, job, payload_json, job.after, 0.0)
        with translated():
            (job_id,) = await store.insert(conn, Rows.of([job], [payload_json],
                                                         tracing.carrier()), 0.0)
        return job_id
