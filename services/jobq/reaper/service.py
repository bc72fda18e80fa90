"""The reaper: brings back jobs nobody is running, and publishes what nobody
published.

:meth:`Reaper.run_once` does one sweep and returns what it did (tests call it
directly): the duties of ``duties.py``, in their order, those the probe (and
the duties before) say have anything to do. Each fails alone: an error in one
(a schedule that cannot fire, a row that breaks a statement) is logged in one
line and recorded, the others run.

:meth:`Reaper.run` is a thin loop around it: one statement (``sweep_probe``)
says which duties have anything to do and when the next lease deadline,
relay time or schedule slot comes; the sweep runs only those, then the loop
sleeps until then (or a NOTIFY from ``jobq.enqueue``), at most
``max_sleep_s``; with nothing going on, up to ``idle_sleep_s`` (``wakes.py``
says why that is safe). On their own clocks: the lost-message check
(``lost.py``) and retention (``retention.py``) between sweeps, and the
backlog gauges (``backlog.py``, one statement each 15 s) in a task beside
the loop: the sample reads every queued row and may take its whole timeout,
which must never hold up a requeue (I3); the invariant monitor
(``audit.py``, what happened since its last round, each 2 s) beside it too.
Idle, the probe, the sweep record, the lost-message check, the backlog
sample and the audit's three statements are all a reaper sends
(bench/idle_cost.py). Errors are logged and the loop goes on. Any number of
reapers may run; they are symmetric peers. Limits: a reaper frozen inside
the relay transaction holds its rows until PostgreSQL's
``idle_in_transaction_session_timeout`` ends its session (5 s).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg

from jobq.amqp.broker import Broker
from jobq.db import open_pool
from jobq.errors import UnavailableError
from jobq.reaper.audit import Audit
from jobq.reaper.backlog import BacklogGauges
from jobq.reaper.duties import DUTIES, Duty, Sweep
from jobq.reaper.lost import republish_lost
from jobq.reaper.retention import prune_expired as prune_finished
from jobq.reaper.store import PgAuditStore, PgReaperStore, ReaperStore
from jobq.reaper.wakes import Wakes
from jobq.rows import Probe
from jobq.runtime import crash
from jobq.runtime.backoff import Backoff
from jobq.runtime.lifecycle import database_answers, lifecycle
from jobq.settings import Settings
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.reaper")

IDLE_IN_TX_S = 5.0
FAILING_AFTER = 3  # sweeps failed in a row before /readyz says not ready
EVERYTHING = Probe(True, True, True, True, True, None, dependants=True, signals=True,
                   expiring=True, superseding=True)

__all__ = ["DUTIES", "IDLE_IN_TX_S", "Reaper", "Sweep"]


class Reaper:
    def __init__(self, settings: Settings, store: ReaperStore | None = None) -> None:
        self.settings = settings
        self.cfg = settings.reaper
        self.store = store  # None until connect() (or a test's fake)
        self.pool: asyncpg.Pool | None = None
        self.broker = Broker(settings.amqp_url, settings.namespace,
                             settings.amqp_heartbeat_s)
        self._stop = asyncio.Event()
        self._wakes = Wakes(settings.session_url, self.cfg)
        self._next_workers_prune = 0.0  # workers gone for a day: check_lost deletes them
        self.backlog = BacklogGauges()
        self.audit = Audit(self.cfg.audit_grace_s)
        self.sweeps = 0
        self.last_sweep_at: float | None = None
        self.failures = 0  # sweeps failed in a row
        self.reaper_id = f"reaper-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._registered = False
        self._recorded_failing = False  # what reaper_status says now

    @property
    def _store(self) -> ReaperStore:
        assert self.store is not None, "call connect() first"
        return self.store

    async def connect(self, *, wait: bool = True) -> None:
        crash.configure(self.settings.crash_at)
        self.pool = await open_pool(self.settings.database_url, wait=wait, max_size=4,
                                    index_paths=True, app_name="jobq-reaper",  # (db.py)
                                    idle_in_tx_s=IDLE_IN_TX_S,
                                    pooled=self.settings.database_pooled)
        await self.broker.connect(wait=wait)
        self.store = PgReaperStore(self.pool, self.broker)

    async def close(self) -> None:
        await self._wakes.close()
        if self.store is not None and self._registered:
            try:  # a clean stop leaves jobq.reaper_status (no stale-sweep alert)
                await self.store.gone(self.reaper_id)
            except Exception as exc:
                log.debug("reaper_gone: %r", exc)
        await self.broker.close()
        if self.pool is not None:
            await self.pool.close()

    def request_stop(self) -> None:
        self._stop.set()
        self._wakes.set()

    # ── one sweep ──

    async def run_once(self, probe: Probe | None = None) -> Sweep:
        """One sweep: every duty, or those ``probe`` says have anything to
        do. Each duty runs alone: one that fails is logged in one line and
        recorded in ``sweep.errors``, and the others still run, so no queue,
        schedule or row can stop the relay."""
        started = time.monotonic()
        sweep = Sweep()
        p = probe or EVERYTHING
        for duty in DUTIES:
            if duty.due(p, sweep):
                await self._duty(sweep, duty)
        sweep.duration_s = time.monotonic() - started
        self.sweeps += 1
        metrics.SWEEP_SECONDS.observe(sweep.duration_s)
        metrics.SWEEP_ROWS.labels("requeued").inc(len(sweep.requeued))
        metrics.SWEEP_ROWS.labels("failed").inc(len(sweep.failed))
        metrics.SWEEP_ROWS.labels("published").inc(sweep.published)
        metrics.SWEEP_ROWS.labels("expired").inc(sweep.expired)
        metrics.LAST_SWEEP.set(time.time())
        if len(sweep.errors) == len(DUTIES):  # nothing worked: the loop backs off
            raise next(iter(sweep.errors.values()))
        try:
            await self._record_sweep(sweep)
        except Exception as exc:
            self._failed_duty(sweep, "record", exc)
        return sweep

    async def _duty(self, sweep: Sweep, duty: Duty) -> None:
        try:
            await duty.run(self._store, self.cfg, self.reaper_id, sweep)
        except Exception as exc:
            self._failed_duty(sweep, duty.name, exc)

    @staticmethod
    def _failed_duty(sweep: Sweep, name: str, exc: Exception) -> None:
        sweep.errors[name] = exc
        log.warning("sweep duty %s failed: %s: %s; the other duties went on", name,
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                    extra=fields(event="sweep_duty_failed", duty=name))

    async def _record_sweep(self, sweep: Sweep) -> None:
        """Monitor the monitor: last sweep per reaper, at most once a second,
        and at once when a duty starts or stops failing (so the status never
        says healthy while /readyz says not ready)."""
        now = time.monotonic()
        changed = bool(sweep.errors) != self._recorded_failing
        if not changed and self.last_sweep_at is not None and now - self.last_sweep_at < 1.0:
            return
        if not self._registered:
            await self._store.register(self.reaper_id, socket.gethostname(), os.getpid())
            self._registered = True
        failed = next(iter(sweep.errors.items()), None)
        overdue = await self._store.record_sweep(
            self.reaper_id, self.sweeps, None if failed is None else
            f"{failed[0]}: {type(failed[1]).__name__}: {failed[1]}"[:1000])
        self._recorded_failing = bool(sweep.errors)
        metrics.OVERDUE.set(overdue.overdue_leases)
        metrics.OLDEST_OVERDUE.set(overdue.oldest_overdue_s)
        self.sweeps = 0
        self.last_sweep_at = now

    async def relay(self) -> int:
        """Publish due rows nobody is known to have published; returns how many."""
        return await self._store.relay(self.cfg.batch_size, budget_s=self.cfg.max_sleep_s)

    async def prune_expired(self) -> int:
        """Delete finished jobs past their queue's retention; returns how many."""
        return await prune_finished(self._store, self.cfg.prune_batch,
                                    self.cfg.prune_max_batches)

    async def check_lost(self) -> int:
        """Republish rows whose messages the broker lost (``lost.py``)."""
        if time.monotonic() >= self._next_workers_prune:  # housekeeping: once a minute
            await self._store.prune_workers()
            self._next_workers_prune = time.monotonic() + 60.0
        return await republish_lost(self._store, self.cfg.republish_after_s)

    # ── the loop ──

    async def probe(self) -> Probe:
        """What the next sweep has to do (``sweep_probe``)."""
        return await self._store.probe()

    async def _readiness(self) -> dict[str, bool | str]:
        # Not ready while sweeps keep failing: a reaper that cannot requeue
        # or relay must not look healthy (issue #13).
        return {"database": await database_answers(self.pool), "broker": self.broker.connected,
                "sweeping": self.failures < FAILING_AFTER}

    async def _sweep_failed(self, exc: BaseException) -> None:
        self.failures += 1
        metrics.SWEEP_FAILURES.inc()
        if self.store is None or not self._registered:
            return
        try:
            await self.store.failed(self.reaper_id, f"{type(exc).__name__}: {exc}"[:1000])
        except Exception:  # the database may be what fails
            pass

    async def run(self) -> None:
        await lifecycle(self.settings, self._stop, self.request_stop, lambda: True,
                        self._readiness, lambda: self.connect(wait=True), self._loop, self.close)
        log.info("reaper stopped")

    async def _loop(self) -> None:
        log.info("reaper ready")
        backoff = Backoff(0.5, 5.0)
        next_lost_check = time.monotonic() + self.cfg.lost_check_s
        next_prune = time.monotonic() + min(self.cfg.prune_every_s, 5.0)
        beside = [asyncio.create_task(self._every(self.cfg.backlog_every_s, self._sample),
                                      name="jobq-backlog"),
                  asyncio.create_task(self._every(self.cfg.audit_every_s, self._audit_once),
                                      name="jobq-audit")]
        try:
            await self._sweep_loop(backoff, next_lost_check, next_prune)
        finally:
            for task in beside:
                task.cancel()
            await asyncio.gather(*beside, return_exceptions=True)

    async def _every(self, every_s: float, fn: Callable[[], Awaitable[object]]) -> None:
        """``fn`` from the first sweep on, each ``every_s`` (0: never), beside
        the sweeps; its errors are its own (logged, the next round tried)."""
        while every_s and not self._stop.is_set():
            try:
                await fn()
            except Exception as exc:
                log.warning("%s failed: %s: %s; trying again in %.0fs",
                            getattr(fn, "__name__", "a side task"), type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "", every_s)
            try:
                await asyncio.wait_for(self._stop.wait(), every_s)
            except TimeoutError:
                pass

    async def _sample(self) -> None:
        await self.backlog.sample(self._store, self.cfg.backlog_timeout_s)

    async def _audit_once(self) -> None:
        assert self.pool is not None
        if self.last_sweep_at is None:  # a reaper back from an outage requeues first
            return
        await self.audit.check(PgAuditStore(self.pool))
        metrics.AUDITED.set(time.time())

    async def _sweep_loop(self, backoff: Backoff, next_lost_check: float,
                          next_prune: float) -> None:
        while not self._stop.is_set():
            self._wakes.before_probe()
            await self._wakes.listen()
            try:
                if time.monotonic() >= next_lost_check:
                    next_lost_check = time.monotonic() + self.cfg.lost_check_s
                    await self.check_lost()
                if self.cfg.prune_every_s and time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + self.cfg.prune_every_s
                    await self.prune_expired()
                probe = await self.probe()
                sweep = await self.run_once(probe)
                if sweep.requeued or sweep.failed or sweep.published:
                    log.info("sweep: %d requeued, %d failed, %d published in %.3fs",
                             len(sweep.requeued), len(sweep.failed), sweep.published,
                             sweep.duration_s)
                if not probe.idle:  # the sweep changed what comes next
                    probe = await self.probe()
                sleep_s = 0.0 if sweep.more else self._wakes.sleep_for(probe)
                backoff.reset()
                if sweep.errors:  # some duty failed (recorded by the sweep): readiness
                    self.failures += 1
                    metrics.SWEEP_FAILURES.inc()
                else:
                    self.failures = 0
            except UnavailableError as exc:
                sleep_s = backoff.next()
                log.warning("sweep failed: %s; retrying in %.1fs", exc, sleep_s)
                await self._sweep_failed(exc)
            except Exception as exc:
                sleep_s = backoff.next()
                log.exception("sweep failed unexpectedly; retrying in %.1fs", sleep_s)
                await self._sweep_failed(exc)
            await self._wakes.sleep(sleep_s)
