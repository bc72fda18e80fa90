"""The reaper: brings back jobs nobody is running, and publishes what nobody
published.

:meth:`Reaper.run_once` does one sweep and returns what it did (tests call it
directly). Each duty fails alone: an error in one (a schedule that cannot
fire, a row that breaks a statement) is logged in one line, the others run:

1. **requeue** active jobs whose lease lapsed (database clock): back to
   ``queued`` with ``stalls + 1``, or ``failed`` as a job of death past
   ``max_stalls`` (``lease.requeue_lapsed``). This commits *before* anything
   is published: a consumer that got the id while the row was still
   ``active`` would drop the message.
2. **settle dependants** (``dependants.py``), a bounded batch a sweep.
3. **relay** every ``queued`` row not known to be published whose
   ``relay_after`` has come: requeued jobs, retries and delayed jobs that fell
   due, SQL-only enqueues, rows whose producer died before publishing. The
   rows stay locked (``FOR UPDATE SKIP LOCKED``) until the broker confirmed
   and they are marked, so two reapers never publish the same row at once
   and a consumer that receives the id early waits for the lock instead of
   missing the row. Dying in between only causes a duplicate message, which
   consumers drop. At most ``max_sleep_s`` of it per sweep: the loop comes
   straight back for a backlog, so requeues keep their pace (I3).

:meth:`Reaper.run` is a thin loop around it: one statement (``sweep_probe``)
says which duties have anything to do and when the next lease deadline,
relay time or schedule slot comes; the sweep runs only those, then the loop
sleeps until then (or a NOTIFY from ``jobq.enqueue``), at most
``max_sleep_s``; with nothing going on, up to ``idle_sleep_s`` (``wakes.py``
says why that is safe). Idle, that probe, the sweep record and the
lost-message check are all a reaper sends (bench/idle_cost.py). Errors are logged and the loop
goes on. Any number of reapers may run; they are symmetric peers. Limits:
a reaper frozen inside the relay transaction holds its rows until
PostgreSQL's ``idle_in_transaction_session_timeout`` ends its session (5 s).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg

from jobq.amqp.broker import Broker
from jobq.db import execute, fetchrow, open_pool, translated
from jobq.errors import UnavailableError
from jobq.reaper.dependants import settle
from jobq.reaper.lost import republish_lost
from jobq.reaper.periodic import fire_due
from jobq.reaper.relay import relay_due
from jobq.reaper.rescue import cut_vanished, requeue_lapsed
from jobq.reaper.retention import prune_expired as prune_finished
from jobq.reaper.unpark import unpark
from jobq.reaper.wakes import Wakes
from jobq.rows import Overdue, Probe, of
from jobq.runtime import crash
from jobq.runtime.backoff import Backoff
from jobq.runtime.lifecycle import database_answers, lifecycle
from jobq.settings import Settings
from jobq.sql import Q
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.reaper")

IDLE_IN_TX_S = 5.0
FAILING_AFTER = 3  # sweeps failed in a row before /readyz says not ready

# What a sweep does, in order; each fails alone (Reaper._duty).
DUTIES = ("cut", "requeue", "schedules", "unpark", "dependants", "relay")
T = TypeVar("T")


@dataclass
class Sweep:
    vanished: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    published: int = 0
    more: bool = False  # a bounded duty stopped with work left: sweep again at once
    duration_s: float = 0.0
    errors: dict[str, Exception] = field(default_factory=dict)  # duty -> what it raised


class Reaper:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cfg = settings.reaper
        self.pool: asyncpg.Pool | None = None
        self.broker = Broker(settings.amqp_url, settings.namespace,
                             settings.amqp_heartbeat_s)
        self._stop = asyncio.Event()
        self._wakes = Wakes(settings.session_url, self.cfg)
        self._next_workers_prune = 0.0  # workers gone for a day: check_lost deletes them
        self.sweeps = 0
        self.last_sweep_at: float | None = None
        self.failures = 0  # sweeps failed in a row
        self.reaper_id = f"reaper-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._registered = False
        self._recorded_failing = False  # what reaper_status says now

    async def connect(self, *, wait: bool = True) -> None:
        crash.configure(self.settings.crash_at)
        self.pool = await open_pool(self.settings.database_url, wait=wait, max_size=4,
                                    index_paths=True, app_name="jobq-reaper",  # (db.py)
                                    idle_in_tx_s=IDLE_IN_TX_S,
                                    pooled=self.settings.database_pooled)
        await self.broker.connect(wait=wait)

    async def close(self) -> None:
        await self._wakes.close()
        if self.pool is not None and self._registered:
            try:  # a clean stop leaves jobq.reaper_status (no stale-sweep alert)
                await execute(self.pool, Q["reaper_gone"], self.reaper_id)
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
        do. Each duty runs alone (``_duty``): one that fails is logged in one
        line and recorded in ``sweep.errors``, and the others still run, so
        no queue, schedule or row can stop the relay."""
        assert self.pool is not None
        started = time.monotonic()
        sweep = Sweep()
        p = probe or Probe(True, True, True, True, True, None, dependants=True)
        if p.vanished or p.active:
            await self._duty(sweep, "cut", cut_vanished(self.pool, sweep.vanished))
        if p.active:
            await self._duty(sweep, "requeue", requeue_lapsed(
                self.pool, self.cfg.batch_size, self.reaper_id, sweep.requeued, sweep.failed))
        if sweep.requeued or sweep.failed:
            crash.point("reaper.after_requeue")
        fired = unparked = 0
        if p.schedules_due:  # once per slot
            fired = await self._duty(sweep, "schedules", fire_due(self.pool)) or 0
        if p.parked:  # as slots free
            unparked = await self._duty(sweep, "unpark", unpark(self.pool)) or 0
        released = 0
        if p.dependants:  # a bounded batch; the probe says so again if more is left
            settled = await self._duty(sweep, "dependants", settle(
                self.pool, self.cfg.settle_budget, self.cfg.settle_rounds))
            released = settled.released if settled is not None else 0
            sweep.more = settled is not None and settled.more
        if p.relay_due or sweep.requeued or fired or unparked or released:  # as they come
            sweep.published = await self._duty(sweep, "relay", self.relay()) or 0
        sweep.duration_s = time.monotonic() - started
        self.sweeps += 1
        metrics.SWEEP_SECONDS.observe(sweep.duration_s)
        metrics.SWEEP_ROWS.labels("requeued").inc(len(sweep.requeued))
        metrics.SWEEP_ROWS.labels("failed").inc(len(sweep.failed))
        metrics.SWEEP_ROWS.labels("published").inc(sweep.published)
        metrics.LAST_SWEEP.set(time.time())
        if len(sweep.errors) == len(DUTIES):  # nothing worked: the loop backs off
            raise next(iter(sweep.errors.values()))
        await self._duty(sweep, "record", self._record_sweep(sweep))
        return sweep

    async def _duty(self, sweep: Sweep, name: str, work: Awaitable[T]) -> T | None:
        try:
            return await work
        except Exception as exc:
            sweep.errors[name] = exc
            log.warning("sweep duty %s failed: %s: %s; the other duties went on", name,
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                        extra=fields(event="sweep_duty_failed", duty=name))
            return None

    async def _record_sweep(self, sweep: Sweep) -> None:
        """Monitor the monitor: last sweep per reaper, at most once a second,
        and at once when a duty starts or stops failing (so the status never
        says healthy while /readyz says not ready)."""
        assert self.pool is not None
        now = time.monotonic()
        changed = bool(sweep.errors) != self._recorded_failing
        if not changed and self.last_sweep_at is not None and now - self.last_sweep_at < 1.0:
            return
        with translated():
            if not self._registered:
                await execute(self.pool, Q["reaper_register"], self.reaper_id,
                              socket.gethostname(), os.getpid())
                self._registered = True
            failed = next(iter(sweep.errors.items()), None)
            row = await fetchrow(self.pool, Q["reaper_swept"], self.reaper_id, self.sweeps,
                                 None if failed is None else
                                 f"{failed[0]}: {type(failed[1]).__name__}: {failed[1]}"[:1000])
        assert row is not None
        overdue = of(Overdue, row)
        self._recorded_failing = bool(sweep.errors)
        metrics.OVERDUE.set(overdue.overdue_leases)
        metrics.OLDEST_OVERDUE.set(overdue.oldest_overdue_s)
        self.sweeps = 0
        self.last_sweep_at = now

    async def relay(self) -> int:
        """Publish due rows nobody is known to have published; returns how many."""
        assert self.pool is not None
        return await relay_due(self.broker, self.pool, self.cfg.batch_size,
                               budget_s=self.cfg.max_sleep_s)

    async def prune_expired(self) -> int:
        """Delete finished jobs past their queue's retention; returns how many."""
        assert self.pool is not None
        return await prune_finished(self.pool, self.cfg.prune_batch,
                                    self.cfg.prune_max_batches)

    async def check_lost(self) -> int:
        """Republish rows whose messages the broker lost (``lost.py``)."""
        assert self.pool is not None
        if time.monotonic() >= self._next_workers_prune:  # housekeeping: once a minute
            with translated():
                await execute(self.pool, Q["workers_prune"])
            self._next_workers_prune = time.monotonic() + 60.0
        return await republish_lost(self.pool, self.broker, self.cfg.republish_after_s)

    # ── the loop ──

    async def probe(self) -> Probe:
        """What the next sweep has to do (``sweep_probe``)."""
        assert self.pool is not None
        with translated():
            row = await fetchrow(self.pool, Q["sweep_probe"])
        assert row is not None
        return of(Probe, row)

    async def _readiness(self) -> dict[str, bool | str]:
        # Not ready while sweeps keep failing: a reaper that cannot requeue
        # or relay must not look healthy (issue #13).
        return {"database": await database_answers(self.pool), "broker": self.broker.connected,
                "sweeping": self.failures < FAILING_AFTER}

    async def _sweep_failed(self, exc: BaseException) -> None:
        self.failures += 1
        metrics.SWEEP_FAILURES.inc()
        if self.pool is None or not self._registered:
            return
        try:
            await execute(self.pool, Q["reaper_failed"], self.reaper_id,
                          f"{type(exc).__name__}: {exc}"[:1000])
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
