"""The consumer: delivery → claim → ack → handler under a renewing lease → finish.

Ack/reject policy (all of it lives in the intake loop, :meth:`Consumer._take_batch`
and :meth:`Consumer._claim_and_start`):

- body not a job id             → reject, no requeue (dead-letters to <ns>.dead)
- claim committed               → ack, then run the handler
- row not claimable (unknown id,
  duplicate delivery, not due,
  already finished)             → ack and drop; the row, not the message, is
                                  the truth, and whoever changed the row owns
                                  publishing it again
- job of a queue we don't handle→ hand it back to the relay, then ack
- database unreachable          → wait, then nack with requeue: never drop
- intake stopped (SIGTERM)      → nack with requeue

A message is acked only after the claim is durable, so dying before the claim
leaves an unacked message that RabbitMQ redelivers; dying after the claim
leaves an active row whose lease the reaper handles. Deliveries are claimed
in batches (whatever arrived during the previous claim's round trip, one
statement) and settled in arrival order, one ``multiple=True`` ack per batch.

Leases are renewed by one statement per renew interval for the whole
process. Each lease also has a local fence (see ``lease.py``): if renewals
stop succeeding, the handler is cancelled before the lease can lapse.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import json
import logging
import os
import random
import socket
import traceback
import uuid
from typing import Any

import aiormq
import asyncpg
from aio_pika.abc import AbstractIncomingMessage
from pydantic import ValidationError

from jobq import crash, lease, metrics
from jobq.app import App, Handler
from jobq.batch import Coalescer
from jobq.broker import Broker
from jobq.db import SESSION_SETTINGS, open_pool, translated
from jobq.errors import ConfigError, DatabaseUnavailable, Fail, LeaseLost, Retry, UnavailableError
from jobq.job import Job
from jobq.lease import Failure, Lease
from jobq.logs import fields
from jobq.producer import publish_and_mark
from jobq.service import (
    database_answers,
    install_stop_signals,
    remove_stop_signals,
    start_health,
    unless_stopped,
)
from jobq.settings import Settings
from jobq.sql import Q

log = logging.getLogger("jobq.consumer")

SETTLE_TIMEOUT_S = 5.0
CLAIM_BATCH_MAX = 256  # deliveries claimed by one statement at most
SUSPECT_WAIT_S = 2.0  # how long a suspect waits for its worker to be free...
MAX_HANDOFFS = 2  # ...before it is handed on; after this many it waits as long as it takes


def new_worker_id() -> str:
    """Unique per process start: host and pid for humans, random for uniqueness."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _channel_of(msg: AbstractIncomingMessage) -> Any:
    """The channel a delivery came on, or None once that channel is closed."""
    try:
        return msg.channel
    except aiormq.exceptions.ChannelInvalidStateError:
        return None


class _Slots:
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class _Running:
    """A job this process runs: its lease, its handler task, why it stopped."""

    __slots__ = ("job", "lease", "stop_reason", "task", "timeout")

    def __init__(self, job: Job, lease_: Lease) -> None:
        self.job = job
        self.lease = lease_
        self.task: asyncio.Task[Any] | None = None
        self.stop_reason: str | None = None  # "lost" | "timeout" | "shutdown"
        self.timeout: asyncio.TimerHandle | None = None

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.job.stop_requested.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()


class Consumer:
    def __init__(self, app: App, settings: Settings, queues: list[str] | None = None,
                 concurrency: int | None = None) -> None:
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
                f"this app handles: {', '.join(app.queues) or 'nothing'}"
            )
        self.concurrency = concurrency or self.cfg.concurrency
        self.worker_id = new_worker_id()
        self.counters: collections.Counter[str] = collections.Counter()
        self.running: dict[uuid.UUID, _Running] = {}
        self.pool: asyncpg.Pool | None = None
        self.broker = Broker(settings.amqp_url, settings.namespace,
                             settings.amqp_heartbeat_s)
        self._slots = asyncio.Semaphore(self.concurrency)
        self._alone = asyncio.Lock()  # one suspect at a time takes every slot
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.cfg.sync_threads or self.concurrency,
            thread_name_prefix="jobq-handler",
        )
        self._inbox: collections.deque[AbstractIncomingMessage] = collections.deque()
        self._inbox_ready = asyncio.Event()
        self._completions: Coalescer[Lease, bool] = Coalescer(self._complete_batch)
        self._tasks: set[asyncio.Task[Any]] = set()  # jobs and their bookkeeping
        self._renew_wakeup = asyncio.Event()  # makes the renewer replan its next renewal
        self._next_renewal = float("inf")  # loop time the renewer plans to renew at
        self._renew_now = False
        # The registry session: holds this worker's advisory lock for its life
        # and carries the heartbeats (see jobq.worker in schema/0001_core.sql).
        self._registry: asyncpg.Connection | None = None
        self._registered = asyncio.Event()
        self._dead = False  # a supervised task died: liveness fails
        self._metric_children: dict[tuple[str, ...], Any] = {}  # labels() once per value
        metrics.IN_FLIGHT.set_function(lambda: len(self.running))  # computed when scraped

    # ── counting ──

    _METRIC = {"claimed": metrics.JOBS_CLAIMED, "completed": metrics.JOBS_COMPLETED,
               "retried": metrics.JOBS_RETRIED, "failed": metrics.JOBS_FAILED,
               "released": metrics.JOBS_RELEASED, "lease_lost": metrics.LEASES_LOST}

    def _count(self, what: str, queue: str) -> None:
        self.counters[what] += 1
        child = self._metric_children.get((what, queue))
        if child is None:
            child = self._metric_children[what, queue] = self._METRIC[what].labels(queue)
        child.inc()

    def _observe_handler(self, queue: str, outcome: str, seconds: float) -> None:
        child = self._metric_children.get(("handler", queue, outcome))
        if child is None:
            child = self._metric_children["handler", queue, outcome] = \
                metrics.HANDLER_SECONDS.labels(queue, outcome)
        child.observe(seconds)

    def _drop(self, reason: str) -> None:
        self.counters[reason] += 1
        metrics.BAD_MESSAGES.labels(reason).inc()

    # ── lifecycle ──

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info("stop requested: draining", extra=fields(worker=self.worker_id))
        self._stop.set()

    async def run(self) -> None:
        """Run until :meth:`request_stop`; drain and release on the way out."""
        crash.configure(self.settings.crash_at)
        install_stop_signals(self.request_stop)
        health = await start_health(self.settings, lambda: not self._dead, self._readiness)
        try:
            started, _ = await unless_stopped(self._connect(), self._stop)
            if started:
                await self._serve()
        finally:
            remove_stop_signals()
            await self._deregister()
            if health is not None:
                await health.stop()
            await self.broker.close()
            if self.pool is not None:
                await self.pool.close()
            self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("consumer stopped", extra=fields(worker=self.worker_id, **dict(self.counters)))

    async def _readiness(self) -> dict[str, bool]:
        return {"database": await database_answers(self.pool),
                "broker": self.broker.connected,
                "accepting": self._ready.is_set() and not self._stop.is_set()}

    async def _connect(self) -> None:
        self.pool = await open_pool(
            self.settings.database_url, wait=True, min_size=1,
            max_size=min(20, 4 + self.concurrency // 4), app_name="jobq-consumer",
        )
        await self.broker.connect(wait=True)
        with translated():
            for q in self.queues:
                await self.pool.execute(Q["queue_ensure"], q)
        self._registry_task = asyncio.create_task(self._registry_loop(), name="jobq-registry")
        await self._registered.wait()

    async def _serve(self) -> None:
        renewer = asyncio.create_task(self._renew_loop(), name="jobq-renewer")
        lag = asyncio.create_task(metrics.watch_loop_lag())
        intake = asyncio.create_task(self._intake_loop(), name="jobq-intake")
        stop_intake = await self.broker.consume(
            self.queues, self._on_message, self.cfg.prefetch or self.concurrency
        )
        self._ready.set()
        log.info("consumer ready", extra=fields(
            worker=self.worker_id, queues=",".join(self.queues), concurrency=self.concurrency))
        stopper = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({stopper, renewer, intake},
                                     return_when=asyncio.FIRST_COMPLETED)
        for task, what in ((renewer, "lease renewer"), (intake, "intake")):
            if task in done and not self._stop.is_set():
                # Supervision: a dead renewer means leases we cannot keep, a
                # dead intake a worker that takes nothing. Exit non-zero; the
                # orchestrator restarts us and the reaper recovers.
                stopper.cancel()
                self._dead = True
                exc = task.exception() if not task.cancelled() else None
                raise RuntimeError(f"{what} died: {exc!r}") from exc
        await self._drain(stop_intake, intake)
        renewer.cancel()
        lag.cancel()
        await asyncio.gather(renewer, lag, return_exceptions=True)

    async def _drain(self, stop_intake: Any, intake: asyncio.Task[None]) -> None:
        """SIGTERM: stop intake, let jobs finish within the grace, release the rest."""
        await stop_intake()
        # The intake loop finishes a claim in flight (starting its jobs, so
        # they are waited for or released below), requeues the rest, returns.
        # Bounded: a claim hanging on an unresponsive database must not eat
        # the grace; if cut off, what it claimed lapses and is reaped.
        self._inbox_ready.set()
        await asyncio.wait({intake}, timeout=self.cfg.shutdown_grace_s)
        if not intake.done():
            log.warning("intake did not stop within %.1fs (claim in flight); cancelled",
                        self.cfg.shutdown_grace_s)
            intake.cancel()
            await asyncio.gather(intake, return_exceptions=True)
        tasks = [r.task for r in self.running.values() if r.task is not None]
        if tasks:
            log.info("waiting up to %.1fs for %d job(s)", self.cfg.shutdown_grace_s, len(tasks))
            await asyncio.wait(tasks, timeout=self.cfg.shutdown_grace_s)
        leftovers = list(self.running.values())
        for r in leftovers:
            r.stop("shutdown")
        # Job tasks finish their own bookkeeping (complete / fail).
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        await self._release([r for r in leftovers if r.stop_reason == "shutdown"])

    async def _release(self, runs: list[_Running], why: str = "worker shutting down",
                       handoff: bool = False) -> None:
        if not runs:
            return
        assert self.pool is not None
        try:
            rows = await lease.release(self.pool, [r.lease for r in runs], why, handoff)
        except UnavailableError as exc:
            log.warning("could not release %d lease(s): %s; they will lapse and be reaped",
                        len(runs), exc)
            return
        for row in rows:
            self._count("released", row["queue"])
            log.info("released (%s)", why, extra=fields(
                event="released", job=row["id"], queue=row["queue"], worker=self.worker_id))
        # Publish them ourselves so they run at once; the relay is the fallback.
        await publish_and_mark(self.broker, self.pool,
                               [(r["id"], r["queue"], r["lock"]) for r in rows])

    # ── intake ──

    def _on_message(self, msg: AbstractIncomingMessage) -> None:
        # A plain function, so aio-pika calls it without a task per delivery.
        # Deliveries wait in the inbox, in arrival (= delivery tag) order, for
        # the intake loop, which claims whatever arrived since its last claim
        # in one statement and settles the batch with one ack.
        self._inbox.append(msg)
        self._inbox_ready.set()

    async def _intake_loop(self) -> None:
        """The only claimer. Jobs run in tasks this consumer owns: aio-pika
        cancels its own callback tasks when a channel closes (broker restart,
        network cut), and a job must outlive that, since its handler only
        needs the database. A lost channel only makes the ack fail; RabbitMQ
        redelivers the id, whose claim then fails and is dropped."""
        while True:
            if not self._inbox and not self._stop.is_set():
                self._inbox_ready.clear()
                await self._inbox_ready.wait()
            if self._stop.is_set():
                await self._requeue_inbox()
                return
            batch = await self._take_batch()
            if batch:
                await self._claim_and_start(batch)

    async def _take_batch(self) -> list[tuple[uuid.UUID, AbstractIncomingMessage]]:
        """Deliveries from the front of the inbox, one free slot each."""
        batch: list[tuple[uuid.UUID, AbstractIncomingMessage]] = []
        inbox = self._inbox
        while inbox and len(batch) < CLAIM_BATCH_MAX:
            msg = inbox[0]
            try:
                job_id = uuid.UUID(msg.body.decode("ascii").strip())
            except (UnicodeDecodeError, ValueError):
                inbox.popleft()
                self._drop("malformed")
                log.warning("malformed message: body is not a job id; dead-lettered",
                            extra=fields(event="malformed", body=repr(msg.body[:80])))
                await self._settle(msg.reject(requeue=False))
                continue
            if self._slots.locked():
                if batch or not await self._wait_for_slot():
                    break
            else:
                await self._slots.acquire()  # free: returns at once
            inbox.popleft()
            batch.append((job_id, msg))
        return batch

    async def _wait_for_slot(self) -> bool:
        """Block for a slot, unless intake stops first (then False)."""
        acquire = asyncio.ensure_future(self._slots.acquire())
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not acquire.done():
                acquire.cancel()
        if acquire.done() and not acquire.cancelled():
            if not self._stop.is_set():
                return True
            self._slots.release()
        return False

    async def _claim_and_start(self, batch: list[tuple[uuid.UUID, AbstractIncomingMessage]]
                               ) -> None:
        msgs = [m for _, m in batch]
        crash.point("consumer.before_claim")
        sent_at = asyncio.get_running_loop().time()
        try:
            rows = await self._claim_batch([i for i, _ in batch])
        except Exception as exc:
            # Never drop: the messages go back and are redelivered later.
            self.counters["claim_unavailable"] += len(batch)
            ids = ", ".join(str(i) for i, _ in batch[:3])
            more = f" and {len(batch) - 3} more" if len(batch) > 3 else ""
            log.warning("cannot claim %s%s: %s; message%s requeued", ids, more, exc,
                        "s" if len(batch) > 1 else "",
                        exc_info=not isinstance(exc, UnavailableError))
            for _ in batch:
                self._slots.release()
            await asyncio.sleep(1.0)
            await self._settle_batch(msgs, ack=False)
            return
        crash.point("consumer.after_claim")
        await self._settle_batch(msgs, ack=True)
        for row in rows:
            if row is None:
                self._slots.release()
                continue
            task = asyncio.create_task(self._job(row, sent_at))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    async def _job(self, row: Any, sent_at: float) -> None:
        hold = _Slots(1)  # slots this job holds; a suspect takes them all
        try:
            await self._run(row, sent_at, hold)
        finally:
            for _ in range(hold.n):
                self._slots.release()

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("job task failed", exc_info=task.exception())

    async def _requeue_inbox(self) -> None:
        """Intake stopped (SIGTERM): whatever is still waiting goes back."""
        msgs = list(self._inbox)
        self._inbox.clear()
        await self._settle_batch(msgs, ack=False)

    async def _settle_batch(self, msgs: list[AbstractIncomingMessage], ack: bool) -> None:
        """Ack (or nack with requeue) a run of deliveries: one frame per
        channel, ``multiple=True`` on the highest tag, when no delivery still
        unsettled has a lower tag on that channel (true by construction: the
        inbox is settled in arrival order; checked anyway). Otherwise one by
        one. A channel may change between deliveries (reconnect): tags are
        per channel. Deliveries of a closed channel are skipped: RabbitMQ
        requeued them already."""
        by_channel: dict[Any, list[AbstractIncomingMessage]] = {}
        for m in msgs:
            ch = _channel_of(m)
            if ch is not None:
                by_channel.setdefault(ch, []).append(m)
        for ch, ms in by_channel.items():
            top = max(ms, key=lambda m: m.delivery_tag or 0)
            tag = top.delivery_tag or 0
            multiple = len(ms) > 1 and not any(
                _channel_of(m) is ch and (m.delivery_tag or 0) < tag for m in self._inbox)
            for m in ([top] if multiple else ms):
                await self._settle(m.ack(multiple=multiple) if ack
                                   else m.nack(multiple=multiple, requeue=True))

    @staticmethod
    async def _settle(op: Any) -> None:
        # The channel may be gone (broker restart): then RabbitMQ redelivers
        # the message itself, and a redelivered id for a claimed row is dropped
        # by the next claim attempt.
        # Bounded: on a channel that died mid-flight an ack can hang, and it
        # must never hold up intake.
        try:
            await asyncio.wait_for(op, SETTLE_TIMEOUT_S)
        except Exception as exc:
            log.debug("ack/nack failed: %r", exc)

    async def _claim_batch(self, ids: list[uuid.UUID]) -> list[Any]:
        assert self.pool is not None
        rows = await lease.claim(self.pool, ids, self.worker_id, self.queues)
        misses = [i for i, r in zip(ids, rows) if r is None]
        if misses:
            # The claims above are committed: failing to explain the misses
            # must not make us drop the rows we just claimed.
            try:
                await self._explain_misses(misses)
            except Exception as exc:
                log.warning("could not look up %d unclaimable id(s): %s", len(misses), exc)
        return rows

    async def _explain_misses(self, ids: list[uuid.UUID]) -> None:
        assert self.pool is not None
        found = await lease.claim_misses(self.pool, ids)
        foreign = []
        for i in ids:
            row = found.get(i)
            if row is None:
                self._drop("unknown_job")
                log.warning("message for unknown job id; dropped",
                            extra=fields(event="unknown_job", job=i))
            elif row["status"] == "queued" and row["queue"] not in self.queues:
                foreign.append(i)
                self._drop("foreign_queue")
                log.warning("job belongs to queue %s, which this worker does not handle; "
                            "handed back to the relay", row["queue"],
                            extra=fields(event="foreign_queue", job=i, queue=row["queue"]))
            elif row["status"] == "queued" and row["not_due"]:
                self._drop("not_due")
                log.info("early delivery for a job not due yet; dropped (the relay "
                         "publishes it when due)", extra=fields(event="not_due", job=i))
            else:
                self._drop("duplicate")
                log.info("duplicate delivery: job is %s; dropped", row["status"],
                         extra=fields(event="duplicate", job=i, status=row["status"]))
        if foreign:
            await lease.hand_back(self.pool, foreign)

    # ── running a job ──

    async def _take_every_slot(self, hold: _Slots) -> None:
        """Wait until this delivery holds every slot (no other job runs here)."""
        async with self._alone:
            while hold.n < self.concurrency:
                await self._slots.acquire()
                hold.n += 1

    async def _run(self, row: Any, sent_at: float, hold: _Slots) -> None:
        loop = asyncio.get_running_loop()
        lease_ = Lease.from_claim(row, sent_at, self.cfg.fence_margin_fraction)
        job = Job(
            id=row["id"], queue=row["queue"], payload=json.loads(row["payload"]),
            attempt=row["attempts"], lock=row["lock"], worker_id=self.worker_id,
            stalls=row["stalls"], created_at=row["created_at"],
        )
        run = _Running(job, lease_)
        self.running[job.id] = run
        self._wake_renewer_if_sooner(lease_)
        started = loop.time()
        self._count("claimed", job.queue)
        if log.isEnabledFor(logging.INFO):
            log.info("claimed", extra=fields(event="claimed", job=job.id, queue=job.queue,
                                             attempt=job.attempt, worker=self.worker_id))
        handler = self.app.handlers[job.queue]
        try:
            self._arm_fence(run)
            if row["suspect"] and self.concurrency > 1:
                # A suspect runs alone, so that if it crashes this process it is
                # the only job charged. Give our slot back (suspects waiting for
                # the lock must not hold what the lock holder needs), then take
                # every slot: the jobs in flight finish, no new one starts. A
                # busy worker hands the suspect on rather than keep it waiting.
                self._slots.release()
                hold.n = 0
                try:
                    await asyncio.wait_for(
                        self._take_every_slot(hold),
                        SUSPECT_WAIT_S if row["handoffs"] < MAX_HANDOFFS else None)
                except TimeoutError:
                    run.stop_reason = "handed_on"
                    await self._release([run], "suspect: worker busy; handed on to run alone",
                                        handoff=True)
                    return
                log.info("suspect job: running it alone", extra=fields(
                    event="suspect", job=job.id, queue=job.queue, worker=self.worker_id))
                if run.stop_reason is not None:
                    await self._after_stop(run)
                    return
            if row["timeout_s"]:
                run.timeout = loop.call_later(float(row["timeout_s"]), run.stop, "timeout")
            run.task = asyncio.create_task(self._call(handler, job))
            outcome: BaseException | None = None
            try:
                await run.task  # only run.stop() cancels it; nothing cancels this task
            except asyncio.CancelledError:
                if run.task.cancelled():
                    outcome = None  # handled by stop_reason below
                else:
                    raise
            except BaseException as exc:
                outcome = exc
            if run.task.cancelled() or run.stop_reason is not None:
                await self._after_stop(run)
            elif outcome is None:
                crash.point("consumer.after_handler")
                await self._finish_ok(run)
            else:
                await self._finish_error(run, handler, outcome)
        finally:
            outcome_label = run.stop_reason or ("error" if run.task is not None and not
                                                run.task.cancelled() and run.task.done() and
                                                run.task.exception() is not None else "ok")
            self._observe_handler(job.queue, outcome_label, loop.time() - started)
            if run.timeout is not None:
                run.timeout.cancel()
            if lease_._fence is not None:
                lease_._fence.cancel()
            if run.stop_reason != "shutdown":
                self.running.pop(job.id, None)

    async def _call(self, handler: Handler, job: Job) -> Any:
        if handler.payload_model is not None:
            job.payload = handler.payload_model.model_validate(job.payload)
        if handler.is_async:
            return await handler.fn(job)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(handler.fn, job))

    def _arm_fence(self, run: _Running) -> None:
        """(Re)schedule the self-fence at the lease's trusted-until time."""
        lease_ = run.lease
        if lease_._fence is not None:
            lease_._fence.cancel()
        lease_._fence = asyncio.get_running_loop().call_at(
            lease_.trusted_until, self._fenced, run)

    def _fenced(self, run: _Running) -> None:
        if run.lease.finishing or run.stop_reason is not None:
            return
        run.lease.lost = "not renewed in time (self-fenced)"
        self._count("lease_lost", run.job.queue)
        log.warning("lease not renewed in time: handler stopped before the lease can lapse",
                    extra=fields(event="lease_lost", job=run.job.id, queue=run.job.queue,
                                 attempt=run.job.attempt, worker=self.worker_id))
        run.stop("lost")
        self._spawn(lease.record_lost(self.pool, run.lease, self.worker_id, run.job.attempt))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after_stop(self, run: _Running) -> None:
        job = run.job
        if run.stop_reason == "timeout":
            await self._finish_error(run, None, TimeoutError(
                "job timeout: the handler ran past the queue's timeout_s and was stopped"))
        elif run.stop_reason == "lost":
            log.info("handler stopped: lease lost (%s)", run.lease.lost, extra=fields(
                event="stopped", job=job.id, queue=job.queue, attempt=job.attempt,
                worker=self.worker_id))
        # "shutdown": released in one statement by _drain.

    async def _finish_ok(self, run: _Running) -> None:
        job = run.job
        run.lease.finishing = True
        ok = await self._retrying(run, self._completions.submit, run.lease)
        if ok:
            self._count("completed", job.queue)
            if log.isEnabledFor(logging.INFO):
                log.info("completed", extra=fields(
                    event="completed", job=job.id, queue=job.queue, attempt=job.attempt,
                    worker=self.worker_id))
        elif ok is False:
            self._lease_lost_at_finish(run, "completion")

    async def _finish_error(self, run: _Running, handler: Handler | None,
                            exc: BaseException) -> None:
        job = run.job
        run.lease.finishing = True
        if isinstance(exc, Retry):
            failure = Failure(run.lease, f"Retry: {exc}", True, exc.delay_s)
        elif isinstance(exc, Fail):
            failure = Failure(run.lease, f"Fail: {exc}", False)
        elif isinstance(exc, ValidationError):
            failure = Failure(run.lease, f"payload failed validation for queue {job.queue}: "
                              f"{exc.error_count()} error(s): {exc.errors()[0]['msg']} at "
                              f"{'.'.join(map(str, exc.errors()[0]['loc'])) or 'payload'}", False)
        elif isinstance(exc, LeaseLost):
            self._lease_lost_at_finish(run, "handler")
            return
        else:
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            failure = Failure(run.lease, tb, True)
        row = await self._retrying(run, self._fail_one, failure)
        if row is None:
            return
        if row is False:
            self._lease_lost_at_finish(run, "failure")
            return
        if row["status"] == "queued":
            self._count("retried", job.queue)
            log.info("handler failed; retry in %.1fs: %s", row["retry_in_s"], failure.error,
                     extra=fields(event="retry", job=job.id, queue=job.queue,
                                  attempt=job.attempt, worker=self.worker_id))
        else:
            self._count("failed", job.queue)
            log.warning("failed: %s", failure.error, extra=fields(
                event="failed", job=job.id, queue=job.queue, attempt=job.attempt,
                worker=self.worker_id))

    async def _fail_one(self, failure: Failure) -> Any:
        assert self.pool is not None
        (row,) = await lease.fail(self.pool, [failure])
        return row if row is not None else False

    async def _retrying(self, run: _Running, op: Any, arg: Any) -> Any:
        """Run a final write, retrying while the database is unreachable and
        the lease is still trusted. Returns op's result, or None if it gave up."""
        loop = asyncio.get_running_loop()
        delay = 0.1
        while True:
            try:
                return await op(arg)
            except DatabaseUnavailable as exc:
                if loop.time() + delay >= run.lease.trusted_until:
                    log.warning("could not record the outcome before the lease ran out (%s); "
                                "the job will be reaped and run again", exc,
                                extra=fields(job=run.job.id, worker=self.worker_id))
                    return None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _lease_lost_at_finish(self, run: _Running, what: str) -> None:
        self._count("lease_lost", run.job.queue)
        run.lease.lost = f"{what} rejected"
        self._spawn(lease.record_lost(self.pool, run.lease, self.worker_id, run.job.attempt))
        log.warning("%s rejected: lease lost (lapsed, reaped or cancelled)", what,
                    extra=fields(event="lease_lost", job=run.job.id, queue=run.job.queue,
                                 attempt=run.job.attempt, worker=self.worker_id))

    async def _complete_batch(self, leases: list[Lease]) -> list[bool]:
        assert self.pool is not None
        return await lease.complete(self.pool, leases)

    # ── registry ──

    async def _registry_loop(self) -> None:
        """Hold a dedicated session with this worker's advisory lock for as
        long as the process lives, so its death is visible to reapers at once.
        If the session ends while we live, re-establish it right away and
        renew every lease: a reaper may have cut them to the grace period."""
        loop = asyncio.get_running_loop()
        delay = 0.1
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(
                    self.settings.database_url, timeout=5,
                    server_settings={"application_name": "jobq-consumer-registry",
                                     **SESSION_SETTINGS})
                ended = asyncio.Event()
                conn.add_termination_listener(lambda _c, ev=ended: ev.set())
                key = random.randrange(1, 2**31)
                while not await conn.fetchval(Q["worker_lock"], key):
                    key = random.randrange(1, 2**31)
                await conn.execute(Q["worker_register"], self.worker_id, socket.gethostname(),
                                   os.getpid(), key)
                self._registry = conn
                self._registered.set()
                self._renew_now = True
                self._renew_wakeup.set()
                delay = 0.1
                await ended.wait()
            except asyncio.CancelledError:
                if conn is not None:
                    conn.terminate()
                raise
            except Exception as exc:
                log.warning("worker registry session unavailable: %s; retrying in %.1fs",
                            exc, delay, extra=fields(worker=self.worker_id))
            if conn is not None and not conn.is_closed():
                conn.terminate()
            if self._registry is not None:
                self._registry = None
                lost_at = loop.time()
                log.warning("worker registry session ended; re-registering (leases are "
                            "trusted for their grace period only until then)",
                            extra=fields(worker=self.worker_id))
                for r in list(self.running.values()):
                    r.lease.session_lost(lost_at)
                    if r.stop_reason is None and not r.lease.finishing:
                        self._arm_fence(r)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _deregister(self) -> None:
        task = getattr(self, "_registry_task", None)
        conn = self._registry
        if conn is not None:
            try:
                await conn.execute(Q["worker_gone"], self.worker_id)
            except Exception as exc:  # best effort: the reaper copes either way
                log.debug("deregister: %r", exc)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ── heartbeat ──

    def _renewal_due(self) -> float:
        """When the lease renewed longest ago (relative to its length) is due."""
        loop = asyncio.get_running_loop()
        if self._renew_now:
            return loop.time()
        return min((r.lease.renewed_at + r.lease.lease_s * self.cfg.renew_fraction
                    for r in self.running.values() if r.stop_reason is None),
                   default=loop.time() + 1.0)

    def _wake_renewer_if_sooner(self, lease_: Lease) -> None:
        # Per claim on the hot path: only a lease due before the planned
        # renewal (a shorter lease than all held) needs the renewer to replan.
        if lease_.renewed_at + lease_.lease_s * self.cfg.renew_fraction < self._next_renewal:
            self._renew_wakeup.set()

    async def _renew_loop(self) -> None:
        """One statement renews every lease this process holds, as soon as the
        lease renewed longest ago (relative to its length) is due."""
        loop = asyncio.get_running_loop()
        failures = 0
        retry_at = float("inf")  # after a failed renewal: try again soon, not an interval later
        while True:
            self._next_renewal = min(self._renewal_due(), retry_at)
            self._renew_now = False
            self._renew_wakeup.clear()
            try:
                await asyncio.wait_for(self._renew_wakeup.wait(),
                                       max(0.0, self._next_renewal - loop.time()))
                continue  # replan: a sooner lease, or a re-registered session
            except TimeoutError:
                pass
            runs = [r for r in self.running.values() if r.stop_reason is None]
            if not runs:
                continue
            assert self.pool is not None
            sent_at = loop.time()
            try:
                if self._registry is None:
                    raise DatabaseUnavailable("worker registry session is down")
                held = await lease.renew(self._registry, [r.lease for r in runs],
                                         self.worker_id)
                metrics.RENEW_SECONDS.observe(loop.time() - sent_at)
                metrics.RENEWALS.labels("ok").inc()
            except UnavailableError as exc:
                metrics.RENEWALS.labels("failed").inc()
                failures += 1
                retry_at = loop.time() + 0.1
                if failures == 1 or failures % 10 == 0:
                    log.warning("lease renewal failed (%s); handlers stop at their fence "
                                "if this goes on", exc, extra=fields(worker=self.worker_id))
                continue
            failures, retry_at = 0, float("inf")
            for r in runs:
                if r.job.id in held:
                    r.lease.extend(sent_at)
                    if r.stop_reason is None and not r.lease.finishing:
                        self._arm_fence(r)
                elif not r.lease.finishing and r.stop_reason is None:
                    r.lease.lost = "renewal matched no row"
                    self._count("lease_lost", r.job.queue)
                    log.warning("lease lost: renewal matched no row (lapsed, reaped or "
                                "cancelled); stopping the handler", extra=fields(
                                    event="lease_lost", job=r.job.id, queue=r.job.queue,
                                    attempt=r.job.attempt, worker=self.worker_id))
                    r.stop("lost")
                    self._spawn(lease.record_lost(self.pool, r.lease, self.worker_id,
                                                  r.job.attempt))
                else:
                    r.lease.renewed_at = sent_at  # finishing: no need to hurry
