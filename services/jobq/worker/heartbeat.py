"""Lease renewal and self-fencing for every job this process runs, and THE
one place that reacts to a lost lease (:meth:`Heartbeat.lose`).

One statement renews all leases of the process, on the registry session, as
soon as the lease renewed longest ago (relative to its length) is due: one
heartbeat per process per interval, whatever the number of jobs. Each run
also has a local fence at its lease's *trusted until* (event-loop clock,
see ``lease.py``): if renewals stop succeeding, the handler is stopped
before the database could let the lease lapse and hand the job to another
worker. A renewal that matches no row means the lease is gone (lapsed,
reaped, cancelled): the handler is stopped at once. A row another
transaction holds at that moment is not waited for (I11: one locked row once
held every lease of the worker): it comes back busy, still ours, and is
tried again after ``BUSY_RETRY_S``; if it stays busy, its fence stops it in
time like any lease that cannot be renewed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from jobq.errors import ConfigError
from jobq.rows import Renewal
from jobq.runtime.loops import RunningLoop
from jobq.settings import ConsumerSettings
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields
from jobq.worker.run import Run, Stop
from jobq.worker.tally import Tally

if TYPE_CHECKING:
    from jobq.worker.store import WorkerStore

log = logging.getLogger("jobq.consumer")

BUSY_RETRY_S = 0.2  # a lease whose row was held by someone else: tried again this soon


class Heartbeat:
    def __init__(self, cfg: ConsumerSettings, worker_id: str, tally: Tally,
                 store: WorkerStore) -> None:
        # Read only: the executor owns the runs (adds, removes) and hands
        # this a view of them when it is built (watch()).
        self.runs: Mapping[uuid.UUID, Run] = MappingProxyType({})
        self.cfg = cfg
        self.worker_id = worker_id
        self.tally = tally
        self.store = store
        self._wakeup = asyncio.Event()  # replan the next renewal
        self._next = float("inf")  # loop time the next renewal is planned for
        self._now = False
        self._side: set[asyncio.Task[None]] = set()
        self._loop = RunningLoop()

    def watch(self, runs: Mapping[uuid.UUID, Run]) -> None:
        """The runs to renew and fence: the executor's, as a read-only view."""
        self.runs = runs

    # ── per run ──

    def track(self, run: Run) -> None:
        """A new run (the executor's): fence it, and renew sooner if its
        lease is the shortest."""
        self._arm(run)
        le = run.lease
        if le.renewed_at + le.lease_s * self.cfg.renew_fraction < self._next:
            self._wakeup.set()

    def _arm(self, run: Run) -> None:
        if run.fence is not None:
            run.fence.cancel()
        run.fence = self._loop().call_at(run.lease.trusted_until, self._fenced, run)

    def _fenced(self, run: Run) -> None:
        if run.lease.finishing or not run.ours:
            return
        self.lose(run, "lease not renewed in time: self-fenced before it could lapse")

    def lose(self, run: Run, why: str, cancelled: bool = False) -> None:
        """The lease is no longer ours: stop the handler, count, log, record.
        Never retried: whoever holds the row now owns what happens next. A
        job cancelled under its run (an operator, a newer job of a latest
        key) is told as that, at INFO: it was a WARNING "lease lost", counted
        with the faults and recorded as one beside the history's cancel."""
        if run.lease.lost is not None:
            return
        run.lease.lost = "cancelled while it ran" if cancelled else why
        run.stop(Stop.LOST)
        job = run.job
        if cancelled:
            self.tally.note("cancelled_running")
            log.info("job cancelled while it ran: the handler is stopped", extra=fields(
                event="cancelled", job=job.id, queue=job.queue, attempt=job.attempt,
                worker=self.worker_id))
            return
        self.tally.count("lease_lost", job.queue)
        log.warning("lease lost (%s): the handler is stopped and cannot finish the job", why,
                    extra=fields(event="lease_lost", job=job.id, queue=job.queue,
                                 attempt=job.attempt, worker=self.worker_id))
        task = asyncio.create_task(self.store.record_lost(run.lease))
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    # ── session events (from the registry) ──

    def session_lost(self, at: float) -> None:
        """A reaper may now cut our leases to their grace: trust them no longer."""
        for run in list(self.runs.values()):
            run.lease.session_lost(at)
            if run.ours and not run.lease.finishing:
                self._arm(run)

    def renew_now(self) -> None:
        self._now = True
        self._wakeup.set()

    # ── the loop ──

    def _due(self) -> float:
        loop = asyncio.get_running_loop()
        if self._now:
            return loop.time()
        return min((r.lease.renewed_at + r.lease.lease_s * self.cfg.renew_fraction
                    for r in self.runs.values() if r.stop_reason is None),
                   default=loop.time() + 1.0)

    async def loop(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        retry_at = float("inf")  # after a failure: again soon, not an interval later
        while True:
            # After a failure, the next try waits for retry_at even though a
            # renewal is overdue: min() with the overdue time made this loop
            # spin (thousands of failed renewals a second, a log line per ten)
            # while the registry session was down.
            self._next = retry_at if failures and not self._now else self._due()
            self._now = False
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), max(0.0, self._next - loop.time()))
                continue  # replan: a sooner lease, or a re-registered session
            except TimeoutError:
                pass
            runs = [r for r in self.runs.values() if r.stop_reason is None]
            if not runs:
                failures, retry_at = 0, float("inf")  # nothing to renew, nothing to retry
                continue
            sent_at = loop.time()
            try:
                held = await self._renew(runs)
            except ConfigError:
                raise  # a missing right: retrying cannot heal it; the consumer stops
            except Exception as exc:
                metrics.RENEWALS.labels("failed").inc()
                failures += 1
                retry_at = loop.time() + 0.1
                if failures == 1 or failures % 10 == 0:
                    log.warning("lease renewal failed (%s); handlers stop at their fence "
                                "if this goes on", exc, extra=fields(worker=self.worker_id))
                continue
            metrics.RENEW_SECONDS.observe(loop.time() - sent_at)
            metrics.RENEWALS.labels("ok").inc()
            failures, retry_at = 0, float("inf")
            if held.busy:  # not extended, still ours: again soon
                failures, retry_at = 1, loop.time() + BUSY_RETRY_S
            for r in runs:
                if r.job.id in held.busy:
                    continue
                if r.job.id in held.renewed:
                    r.lease.extend(sent_at)
                    if r.ours and not r.lease.finishing:
                        self._arm(r)
                elif r.ours and not r.lease.finishing:
                    self.lose(r, "renewal matched no row: lapsed, reaped or cancelled",
                              cancelled=r.job.id in held.cancelled)
                else:
                    r.lease.renewed_at = sent_at  # finishing: its own write will tell

    async def _renew(self, runs: list[Run]) -> Renewal:
        # Bounded (the store ends a session a timeout left unfit): a renewal
        # hanging on a cut network must not stall every later one.
        within = max(1.0, min(r.lease.lease_s for r in runs) * self.cfg.renew_fraction)
        return await self.store.renew([r.lease for r in runs], within)
