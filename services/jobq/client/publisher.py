"""The producer's path, shared by every concurrent publish of one client.

A publish waits for two things and nothing else: its row's commit and the
broker's confirm of its id. Everything else is shared or moved off the path:

- **Rows, group-committed.** Concurrent publishes of one client go to the
  database as one ``enqueue_many`` statement (:class:`~jobq.runtime.batch.Coalescer`:
  while one batch is in flight the next fills up; alone, a publish goes out
  at once). One transaction and one WAL flush for many jobs. A batch refused
  for one caller's bad input is retried caller by caller, so the error
  reaches that caller only and the others' jobs are unaffected.
- **Ids, group-published.** The ids of concurrent publishes go to the
  broker together (:class:`Sends`: those of one pass of the event loop, with
  no wait for an earlier batch's confirms), packed per queue
  up to a hundred ids a message (``amqp/bodies.py``): one confirm, one
  queue entry, one delivery for them all (#49).
- **Marks, deferred.** After the confirm, the ids are handed to
  :class:`Marks`, which writes ``published_at`` a quarter second later (at most a
  quarter of the relay's grace) in
  one statement for what accumulated, off the caller's path; most rows are
  claimed by then and the statement writes nothing for them. A mark that never happens (the process
  died, the database was away) only lets the relay publish the id once more
  after ``relay_grace_s``: a duplicate message, which consumers drop, never a
  lost job. ``close()`` writes the marks still pending.

The row is still committed before its id is on the wire (the id comes back
from the commit), so a consumer never receives an id whose row it cannot see.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import asyncpg

from jobq.amqp.bodies import PACK_MAX
from jobq.amqp.broker import Broker
from jobq.client import store
from jobq.client.publish import mark, publish_ids
from jobq.client.store import Row
from jobq.errors import BadInput
from jobq.newjob import NewJob
from jobq.runtime.batch import Coalescer


class Rows:
    """Group commit of the rows of concurrent publishes."""

    def __init__(self, pool: asyncpg.Pool, relay_grace_s: float, max_batch: int = 500) -> None:
        self._pool = pool
        self._grace = relay_grace_s
        self._coalescer: Coalescer[list[Row], list[uuid.UUID]] = Coalescer(
            self._commit_each_on_bad_input, max_batch=max_batch)

    @staticmethod
    def of(jobs: Sequence[NewJob], texts: Sequence[str], trace: str | None) -> list[Row]:
        """The rows of ``jobs`` (payloads already checked), one trace context."""
        return [Row(j, t, trace) for j, t in zip(jobs, texts)]

    async def insert(self, rows: list[Row]) -> list[uuid.UUID]:
        """Commit the rows; their ids in input order."""
        return await self._coalescer.submit(rows)

    async def commit(self, rows: list[Row], grace_s: float) -> list[uuid.UUID]:
        """Commit ``rows`` now, on their own, with ``grace_s`` (0: the
        relay's to publish; jobq.enqueue_many NOTIFYs the reapers)."""
        return await store.insert(self._pool, rows, grace_s)

    async def _commit(self, rows: list[Row]) -> list[uuid.UUID]:
        return await self.commit(rows, self._grace)

    async def _commit_each_on_bad_input(
            self, calls: list[list[Row]]) -> list[list[uuid.UUID] | BaseException]:
        flat = [row for call in calls for row in call]
        try:
            ids = await self._commit(flat)
        except BadInput:
            if len(calls) == 1:
                raise
            # The statement was refused (rolled back): commit caller by
            # caller, so that the refusal reaches its own caller only.
            out: list[list[uuid.UUID] | BaseException] = []
            for call in calls:
                try:
                    out.append(await self._commit(call))
                except BadInput as exc:
                    out.append(exc)
            return out
        split: list[list[uuid.UUID] | BaseException] = []
        k = 0
        for call in calls:
            split.append(ids[k:k + len(call)])
            k += len(call)
        return split


class Marks:
    """Deferred ``published_at`` writes: one statement per ``delay_s`` for
    what accumulated; never on a caller's path, never raising.

    The delay is the point: a row claimed before its mark needs none (the
    statement skips it without writing), and with consumers keeping up most
    are claimed within milliseconds. Marked at once, two rows in three were
    still queued and got an extra row version (bench/scaling.py: 6.66 row
    writes per job). The client keeps ``delay_s`` to a quarter of the relay's
    grace at most (a 0.1 s grace: 25 ms), so the relay never outruns a mark."""

    def __init__(self, pool: asyncpg.Pool, delay_s: float, max_batch: int = 2000) -> None:
        self._pool = pool
        self._max = max_batch
        self._delay = delay_s
        self._pending: list[tuple[uuid.UUID, uuid.UUID | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

    def add(self, rows: Sequence[tuple[uuid.UUID, uuid.UUID | None]]) -> None:
        if not rows:
            return
        self._pending.extend(rows)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending:
            if not self._closing.is_set():
                try:  # close() cuts the wait short
                    await asyncio.wait_for(self._closing.wait(), self._delay)
                except TimeoutError:
                    pass
            batch, self._pending = self._pending[:self._max], self._pending[self._max:]
            await mark(self._pool, batch)

    async def close(self) -> None:
        """Write what is pending now (called before the pool closes)."""
        self._closing.set()
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)


class Sends:
    """The ids of publishes that reach the broker in one pass of the event
    loop go out together (a group commit's callers resume in one pass).
    Nothing waits for an earlier batch's confirms: batches overlap on the
    wire, so a publish never waits longer than its own confirm."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._pending: list[tuple[list[tuple[uuid.UUID, str]], asyncio.Future[set[uuid.UUID]]]] = []
        self._flights: set[asyncio.Task[None]] = set()

    async def send(self, items: list[tuple[uuid.UUID, str]]) -> set[uuid.UUID]:
        """The ids of ``items`` the broker confirmed. Never raises."""
        if not items:
            return set()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[set[uuid.UUID]] = loop.create_future()
        self._pending.append((items, fut))
        if len(self._pending) == 1:  # the first of this pass: send after the others
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.create_task(self._send_all(batch))
        self._flights.add(task)
        task.add_done_callback(self._flights.discard)

    async def _send_all(self, batch: list[tuple[list[tuple[uuid.UUID, str]],
                                                asyncio.Future[set[uuid.UUID]]]]) -> None:
        confirmed: set[uuid.UUID] = set()
        try:
            confirmed = await publish_ids(  # a batch the producer made: packed full
                self._broker, [it for items, _ in batch for it in items], PACK_MAX)
        finally:  # cancelled (the loop closing): none confirmed, the relay's
            for items, fut in batch:
                if not fut.done():
                    fut.set_result({i for i, _ in items if i in confirmed})


async def publish(sends: Sends, marks: Marks, items: list[tuple[uuid.UUID, str]]) -> None:
    """Publish committed rows' ids and defer their marks; never raises (what
    the broker did not confirm stays unmarked, for the relay)."""
    marks.add([(i, None) for i in await sends.send(items)])
