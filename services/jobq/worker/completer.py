"""The end of every run: complete, fail (the handler's error mapped to a
retry or a final failure), release, or charge a child's death.

Every final write is fenced by the lease token and idempotent, so it is
retried on *any* error — a dropped connection, a driver's internal error,
a bug — until it succeeds, the lease is provably lost (the write matched no
row: :meth:`Heartbeat.lose`), or the lease is no longer trusted. The
heartbeat keeps renewing the lease meanwhile, so a job is never left to wait
a whole lease, and charged a stall, because jobq's own write failed
(issue #19). Completions of concurrent jobs share one statement
(:class:`~jobq.runtime.batch.Coalescer`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal, TypeVar

from jobq.client.results import ResultInvalid, encode
from jobq.db import is_transient
from jobq.errors import (
    ConfigError,
    RateLimited,
    Snooze,
    Suspended,
)
from jobq.lease import Lease
from jobq.rows import Failed, Spell
from jobq.runtime.backoff import Backoff
from jobq.runtime.batch import Coalescer
from jobq.runtime.loops import RunningLoop
from jobq.status import Status
from jobq.telemetry.logs import fields, printable
from jobq.worker.heartbeat import Heartbeat
from jobq.worker.run import Run
from jobq.worker.store import WorkerStore
from jobq.worker.tally import Tally
from jobq.worker.verdicts import failure_for

log = logging.getLogger("jobq.consumer")

T = TypeVar("T")


class GaveUp(enum.Enum):
    """A fenced write not answered before the lease ran out of trust."""

    GAVE_UP = "gave up"


_GIVE_UP: Final = GaveUp.GAVE_UP


class Completer:
    def __init__(self, store: WorkerStore, heartbeat: Heartbeat, tally: Tally,
                 worker_id: str) -> None:
        self.store = store
        self.heartbeat = heartbeat
        self.tally = tally
        self.worker_id = worker_id
        self._completions: Coalescer[tuple[Lease, str | None], bool] = Coalescer(
            self._complete_batch)
        self._fatal: ConfigError | None = None
        self._fatal_seen = asyncio.Event()
        self._loop = RunningLoop()

    async def watch(self) -> None:
        """Ends with the first mistake a finishing write met that retrying
        cannot heal (a missing right): the consumer drains and exits 2."""
        await self._fatal_seen.wait()
        assert self._fatal is not None
        raise self._fatal

    async def _complete_batch(self, items: list[tuple[Lease, str | None]]) -> list[bool]:
        return await self.store.complete([le for le, _ in items], [r for _, r in items])

    async def fenced(self, run: Run, what: str,
                     op: Callable[[], Awaitable[T]]) -> T | Literal[GaveUp.GAVE_UP]:
        """Run a fenced write until it answers; ``_GIVE_UP`` if the lease ran
        out of trust first (then the reaper recovers the job)."""
        loop = self._loop()
        backoff, reported = Backoff(0.05, 1.0), False
        while True:
            try:
                return await op()
            except Exception as exc:
                if isinstance(exc, ConfigError):
                    if self._fatal is None:
                        self._fatal = exc
                        self._fatal_seen.set()
                elif not is_transient(exc) and not reported:
                    reported = True  # a bug or the unexpected: say it once, keep trying
                    log.error("%s of job %s raised; retrying", what, run.job.id, exc_info=exc)
                delay = backoff.next()
                if loop.time() + delay >= run.lease.trusted_until:
                    log.warning("could not record the %s before the lease ran out (%s); the "
                                "job will be reaped and run again", what, exc,
                                extra=fields(job=run.job.id, worker=self.worker_id))
                    return _GIVE_UP
                await asyncio.sleep(delay)

    async def complete(self, run: Run, value: Any = None) -> None:
        """Record success, with the handler's return value as the result
        (one that cannot be stored fails the job instead, with the reason)."""
        job = run.job
        try:
            result = encode(value, run.max_result_bytes)
        except ResultInvalid as exc:
            await self.fail(run, exc)
            return
        run.lease.finishing = True
        ok = await self.fenced(run, "completion",
                               lambda: self._completions.submit((run.lease, result)))
        if ok is True:
            self.tally.count("completed", job.queue)
            if run.limited:
                await self._slot_freed(run)
            if log.isEnabledFor(logging.INFO):
                log.info("completed", extra=fields(event="completed", job=job.id,
                                                   queue=job.queue, attempt=job.attempt,
                                                   worker=self.worker_id))
        elif ok is False:
            self.heartbeat.lose(run, "completion rejected")

    async def _slot_freed(self, run: Run) -> None:
        """A limited queue's slot is free: publish its oldest parked job now
        rather than at the next reaper sweep (best effort: the reaper is the
        fallback)."""
        try:
            await self.store.publish(await self.store.unpark_freed(run.lease))
        except Exception as exc:
            log.debug("unpark after completion: %r", exc)

    def completed_by_handler(self, run: Run) -> None:
        """The handler completed the job in its own transaction
        (``job.complete_in``): nothing left to write."""
        run.lease.finishing = True
        job = run.job
        self.tally.count("completed", job.queue)
        log.info("completed (in the handler's transaction)", extra=fields(
            event="completed", job=job.id, queue=job.queue, attempt=job.attempt,
            worker=self.worker_id))

    async def fail(self, run: Run, exc: BaseException) -> None:
        if isinstance(exc, Suspended):
            return await self.suspend(run, exc)
        if isinstance(exc, Snooze):
            return await self.snooze(run, exc)
        job = run.job
        run.lease.finishing = True
        failure = failure_for(run, exc)
        if failure is None:
            self.heartbeat.lose(run, "the handler reported the lease lost")
            return

        async def write() -> Failed | None:
            (row,) = await self.store.fail([failure])
            return row

        row = await self.fenced(run, "failure", write)
        if row is _GIVE_UP:
            return
        if row is None:
            self.heartbeat.lose(run, "failure rejected")
        elif row.status == Status.QUEUED:
            self.tally.count("retried", job.queue)
            when = "" if row.retry_in_s is None else f" in {row.retry_in_s:.1f}s"
            log.info("handler failed; retry%s: %s", when, failure.error[:500],
                     extra=fields(event="retry", job=job.id, queue=job.queue,
                                  attempt=job.attempt, worker=self.worker_id))
        else:
            self.tally.count("failed", job.queue)
            log.error("failed: %s", failure.error[:500], extra=fields(
                event="failed", job=job.id, queue=job.queue, attempt=job.attempt,
                worker=self.worker_id, traceback=failure.traceback))

    async def snooze(self, run: Run, exc: Snooze) -> None:
        """jobq.Snooze / jobq.RateLimited: put back for a while, the run not
        counted; past errors.MAX_SNOOZES the job fails instead."""
        job = run.job
        run.lease.finishing = True
        kind = "rate_limited" if isinstance(exc, RateLimited) else "snoozed"
        row = await self.fenced(run, kind, lambda: self.store.snooze(
            run.lease, exc.seconds, kind == "rate_limited", printable(str(exc), 500)))
        if row is _GIVE_UP:
            return
        if row is None:
            self.heartbeat.lose(run, f"{kind} rejected")
        elif row.status == Status.FAILED:
            self.tally.count("failed", job.queue)
            log.error("failed: snoozed too often (%s)", exc, extra=fields(
                event="failed", job=job.id, queue=job.queue, attempt=job.attempt,
                worker=self.worker_id))
        else:
            self.tally.count("snoozed", job.queue)
            log.info("%s for %.3gs: %s", kind.replace("_", " "), exc.seconds, exc, extra=fields(
                event=kind, job=job.id, queue=job.queue, attempt=job.attempt,
                worker=self.worker_id))

    async def suspend(self, run: Run, exc: Suspended) -> None:
        """job.sleep / job.wait_for ended the run: the job waits holding
        nothing (I12), the run not counted."""
        job = run.job
        run.lease.finishing = True
        ok = await self.fenced(run, "suspension", lambda: self.store.suspend(
            run.lease, exc.until, exc.wake_on, printable(str(exc), 500), exc.joining))
        if ok is _GIVE_UP:
            return
        if not ok:
            self.heartbeat.lose(run, "suspension rejected")
            return
        self.tally.count("suspended", job.queue)
        log.info("suspended: %s", exc, extra=fields(
            event="suspended", job=job.id, queue=job.queue, attempt=job.attempt,
            worker=self.worker_id))

    async def child_died(self, run: Run, why: str) -> None:
        """Its child process died running it: charge it, requeue it now."""
        job = run.job
        run.lease.finishing = True
        row = await self.fenced(run, "child death",
                                lambda: self.store.child_died(run.lease, why))
        if row is _GIVE_UP:
            return
        if row is None:
            self.heartbeat.lose(run, "child death not recorded: lease already gone")
            return
        self.tally.count("child_died", job.queue)
        log.warning("%s; %s", why, "failed as a job of death" if row.status == Status.FAILED
                    else f"requeued (stall {row.stalls})",
                    extra=fields(event="child_died", job=job.id, queue=job.queue,
                                 attempt=job.attempt, worker=self.worker_id))
        if row.status == Status.QUEUED and row.due:
            await self.store.publish([Spell(row.id, row.queue, row.lock)])

    async def release(self, runs: Sequence[Run], why: str, handoff: bool = False) -> None:
        """Give leases back at once (no stall, no error) and publish the ids."""
        if not runs:
            return
        rows: list[Spell] = []
        backoff = Backoff(0.1, 1.0)
        for attempt in range(4):
            try:
                rows = await self.store.release([r.lease for r in runs], why, handoff)
                break
            except Exception as exc:
                if attempt == 3:
                    log.warning("could not release %d lease(s): %s; they will lapse and be "
                                "reaped", len(runs), exc)
                    return
                await backoff.sleep()
        for row in rows:
            self.tally.count("released", row.queue)
            log.info("released (%s)", why, extra=fields(
                event="released", job=row.id, queue=row.queue, worker=self.worker_id))
        # Publish them ourselves so they run at once; the relay is the fallback.
        await self.store.publish(rows)
