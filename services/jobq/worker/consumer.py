"""The consumer process: wiring, start, drain and supervision.

It owns no job logic itself; it connects the units and keeps them alive:

- ``intake.py``     deliveries → batched claims → acks (the ack policy)
- ``acks.py``       how a batch is settled: one multiple=True frame per channel
- ``executor.py``   one task per claimed job, to its recorded end
- ``completer.py``  complete / fail / release / child death, retried until known
- ``heartbeat.py``  one renewal statement per process, self-fencing, lease loss
- ``registry.py``   the advisory-lock session that makes a death visible at once
- ``processes.py``  ``--pool process``: sync handlers in child processes

Supervision: if the heartbeat or the intake loop dies, the process exits
non-zero (the orchestrator restarts it, the reaper recovers its jobs);
nothing dies silently. SIGTERM drains: intake stops, running jobs get
``shutdown_grace_s`` to finish, the rest are released (not stalled) and
republished at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping

import asyncpg

from jobq.amqp.broker import Broker
from jobq.amqp.connect import start_when_possible
from jobq.db import connection, open_pool
from jobq.errors import ConfigError
from jobq.handlers import Handlers
from jobq.runtime.lifecycle import database_answers, lifecycle
from jobq.settings import Settings
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields
from jobq.worker.completer import Completer
from jobq.worker.executor import Executor
from jobq.worker.heartbeat import Heartbeat
from jobq.worker.intake import Intake
from jobq.worker.processes import ProcessPool
from jobq.worker.registry import Registry
from jobq.worker.run import Run, Stop
from jobq.worker.store import PgStore, declare_schedules, ensure_queue, warm
from jobq.worker.tally import Tally
from jobq.worker.units import assemble

log = logging.getLogger("jobq.consumer")

# A consumer going from idle to busy wakes the reapers at most this often
# (Consumer._claimed): a woken reaper keeps its busy pace about as long.
WAKE_EVERY_S = 0.5


def new_worker_id() -> str:
    """Unique per process start: host and pid for humans, random for uniqueness."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Consumer:
    def __init__(self, app: Handlers, settings: Settings, queues: list[str] | None = None,
                 concurrency: int | None = None, *, app_spec: str | None = None) -> None:
        self.app = app
        self.settings = settings
        self.cfg = settings.consumer
        self.queues = sorted(set(queues or app.queues))
        if not self.queues:
            raise ConfigError("the app registers no handlers: nothing to consume")
        missing = [q for q in self.queues if q not in app.handlers]
        if missing:
            raise ConfigError(
                f"no handler registered for queue(s) {', '.join(missing)}; "
                f"this app handles: {', '.join(app.queues) or 'nothing'}")
        if self.cfg.pool == "process" and app_spec is None:
            raise ConfigError("--pool process needs the app as module:attribute")
        self.app_spec = app_spec
        self.concurrency = concurrency or self.cfg.concurrency
        self.worker_id = new_worker_id()
        self.tally = Tally()
        self.counters = self.tally.counters
        self._notifies: set[asyncio.Task[None]] = set()  # worker_busy NOTIFYs in flight
        self._woke_at = -WAKE_EVERY_S
        self.broker = Broker(settings.amqp_url, settings.namespace, settings.amqp_heartbeat_s)
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._dead = False  # a supervised task died: liveness fails
        self._problem: str | None = None
        self.pool: asyncpg.Pool | None = None
        self.processes: ProcessPool | None = None
        self.registry: Registry | None = None
        self.executor: Executor | None = None
        self.intake: Intake | None = None
        self._heartbeat: Heartbeat | None = None
        self._completer: Completer | None = None
        metrics.IN_FLIGHT.set_function(lambda: len(self.runs))  # computed when scraped

    @property
    def runs(self) -> Mapping[uuid.UUID, Run]:
        """The jobs running here (the executor owns them)."""
        return self.executor.runs if self.executor is not None else {}

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info("stop requested: draining", extra=fields(worker=self.worker_id))
        self._stop.set()

    async def run(self) -> None:
        """Run until :meth:`request_stop`; drain and release on the way out."""
        await lifecycle(self.settings, self._stop, self.request_stop, lambda: not self._dead,
                        self._readiness, self._connect, self._serve, self._close)
        log.info("consumer stopped", extra=fields(worker=self.worker_id, **dict(self.counters)))

    async def _close(self) -> None:
        if self.registry is not None:
            await self.registry.deregister()
        await self.broker.close()
        if self.processes is not None:
            await self.processes.close()
        if self.pool is not None:
            await self.pool.close()
        if self.executor is not None:
            self.executor.close()

    async def _readiness(self) -> dict[str, bool | str]:
        checks: dict[str, bool | str] = {
            "database": await database_answers(self.pool), "broker": self.broker.connected,
            "accepting": self.ready.is_set() and not self._stop.is_set()}
        if self._problem:
            checks["problem"] = self._problem  # why it is stopping (a missing right, ...)
        return checks

    async def _connect(self) -> None:
        pool = self.pool = await open_pool(
            self.settings.database_url, wait=True, min_size=1,
            max_size=min(20, 4 + self.concurrency // 4), app_name="jobq-consumer",
            pooled=self.settings.database_pooled,
            # Through PgBouncer a session's plans stay on a server session the
            # next statement may not get: nothing to warm.
            init=None if self.settings.database_pooled else
            lambda conn: warm(conn, self.worker_id, self.queues))
        await self.broker.connect(wait=True)
        for q in self.queues:
            await ensure_queue(pool, q)
        if self.app.schedules:  # periodic jobs the app declares (fired by the reapers)
            async with connection(pool) as conn:
                await declare_schedules(conn, list(self.app.schedules.values()))
        if self.cfg.pool == "process":
            assert self.app_spec is not None
            self.processes = ProcessPool(
                self.app_spec, self.concurrency, max_jobs_per_child=self.cfg.max_jobs_per_child,
                max_memory_mb=self.cfg.max_memory_per_child_mb,
                kill_grace_s=self.cfg.child_kill_grace_s)
            await self.processes.start()
        self.registry = Registry(self.settings.session_url, self.worker_id,
                                 on_lost=self._session_lost, on_registered=self._registered,
                                 pool_kind=self.cfg.pool, declared=self.app.declared())
        store = PgStore(pool, self.broker, self.registry, self.worker_id, self.queues)
        units = assemble(self.app, self.cfg, store, worker_id=self.worker_id,
                         queues=self.queues, concurrency=self.concurrency, tally=self.tally,
                         stop=self._stop, processes=self.processes,
                         on_claimed=lambda: self._claimed(store),
                         hand_back=self._hand_back)
        self._heartbeat, self._completer = units.heartbeat, units.completer
        self.executor, self.intake = units.executor, units.intake
        self.registry.start()
        await self.registry.wait_registered()

    async def _hand_back(self, ids: list[uuid.UUID], queue: str) -> set[uuid.UUID]:
        """Held ids back to the broker, one message each (worker/handback.py)."""
        return await self.broker.publish([(i, queue) for i in ids], per_message=1)

    def _claimed(self, store: PgStore) -> None:
        """Jobs were claimed: if none ran here, this process just went from
        idle to busy, and a reaper may be in its idle sleep (reaper/wakes.py).
        At most every WAKE_EVERY_S: a woken reaper keeps the busy pace that
        long, and short jobs at a low rate must not cost a statement each."""
        now = time.monotonic()
        if not self.runs and now - self._woke_at >= WAKE_EVERY_S:
            self._woke_at = now
            task = asyncio.create_task(store.wake_reapers())
            self._notifies.add(task)
            task.add_done_callback(self._notifies.discard)

    def _session_lost(self, at: float) -> None:
        if self._heartbeat is not None:
            self._heartbeat.session_lost(at)

    def _registered(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.renew_now()

    async def _serve(self) -> None:
        assert self._heartbeat is not None and self.intake is not None
        assert self._completer is not None
        renewer = asyncio.create_task(self._heartbeat.loop(), name="jobq-heartbeat")
        lag = asyncio.create_task(metrics.watch_loop_lag())
        intake_ = self.intake
        started = await start_when_possible(lambda: self.broker.consume(
            self.queues, intake_.on_message, self.cfg.prefetch or self.concurrency), self._stop)
        stop_intake = started or _nothing  # None: stopped before the broker took it
        if started is not None:
            self.ready.set()
            log.info("consumer ready", extra=fields(
                worker=self.worker_id, queues=",".join(self.queues),
                concurrency=self.concurrency, pool=self.cfg.pool))
        # Deliveries wait in the intake's inbox until here: no job runs before
        # the line above says the consumer is ready.
        intake = asyncio.create_task(self.intake.loop(), name="jobq-intake")
        stopper = asyncio.create_task(self._stop.wait())
        finishing = asyncio.create_task(self._completer.watch())
        assert self.registry is not None
        registry = self.registry.task
        done, _ = await asyncio.wait({stopper, renewer, intake, finishing, registry},
                                     return_when=asyncio.FIRST_COMPLETED)
        for task, what in ((renewer, "lease renewer"), (intake, "intake"),
                           (finishing, "completer"), (registry, "worker registry")):
            if task in done and not self._stop.is_set():
                # A dead renewer means leases we cannot keep, a dead intake a
                # worker that takes nothing: exit non-zero, get restarted.
                stopper.cancel()
                self._dead = True
                exc = task.exception() if not task.cancelled() else None
                if isinstance(exc, ConfigError):
                    # A mistake, not a crash: drain as on SIGTERM (running jobs
                    # finish or are released, never left to lapse), then one
                    # line and exit 2 (cli.py).
                    log.error("stopping: %s", exc, extra=fields(worker=self.worker_id))
                    self._problem = str(exc)
                    self._stop.set()
                    await self._drain(stop_intake, intake)
                    renewer.cancel()
                    raise exc
                raise RuntimeError(f"{what} died: {exc!r}") from exc
        await self._drain(stop_intake, intake)
        renewer.cancel()
        lag.cancel()
        finishing.cancel()
        await asyncio.gather(renewer, lag, finishing, return_exceptions=True)

    async def _drain(self, stop_intake: Callable[[], Awaitable[None]],
                     intake: asyncio.Task[None]) -> None:
        """SIGTERM: stop intake, let jobs finish within the grace, release the rest."""
        assert self.intake is not None and self.executor is not None
        assert self._completer is not None
        grace = self.cfg.shutdown_grace_s
        await stop_intake()
        # The intake loop finishes a claim in flight (its jobs start, so they
        # are waited for or released below) and requeues the rest. Bounded:
        # a claim hanging on an unresponsive database must not eat the grace.
        self.intake.wake()
        pending = {intake, *self.intake.retries}
        _, late = await asyncio.wait(pending, timeout=grace)
        for task in late:
            log.warning("intake did not stop within %.1fs (claim in flight); cancelled", grace)
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        tasks = [r.task for r in self.runs.values() if r.task is not None]
        if tasks:
            log.info("waiting up to %.1fs for %d job(s)", grace, len(tasks))
            await asyncio.wait(tasks, timeout=grace)
        left = self.executor.stop_all(Stop.SHUTDOWN)
        if self.executor.tasks:  # job tasks record their own ends (complete / fail)
            await asyncio.wait(list(self.executor.tasks), timeout=10)
        stopped = [r for r in left if r.stop_reason is Stop.SHUTDOWN]
        await self._completer.release(stopped, "worker shutting down")
        self.executor.forget(stopped)


async def _nothing() -> None:
    """Stopping an intake that never started."""
