"""Intake: deliveries → batched claims → acks, the consumer's ack policy.

- body not a job id             → reject, no requeue (dead-letters to <ns>.dead)
- body of several ids           → one slot each; the message is settled when
                                  the last is (acks.py); a line that is not
                                  an id: the others run, the message is then
                                  dead-lettered; ids held while no slot frees
                                  go back to the fleet (handback.py)
- claim committed               → ack, then the executor runs the job (a
                                  higher-priority job may run in the
                                  delivered one's place: the delivered one
                                  is handed back and published again)
- row not claimable (unknown id,
  duplicate delivery, not due,
  already finished)             → ack and drop: the row, not the message, is
                                  the truth, and whoever changed the row owns
                                  publishing it again
- job of a queue we don't handle→ ack and drop (an id published to the
                                  wrong queue by hand: the job's own queue
                                  has its message, or the relay and the
                                  lost-message check publish it from the row)
- claim failed, database away   → retry that batch with a short backoff while
                                  the rest of intake goes on; still failing:
                                  nack with requeue. Never dropped.
- claim failed on the job itself
  (a data exception, SQLSTATE 22)→ claim the batch's ids one by one; the one
                                  that fails is failed with the reason
                                  (quarantined) and acked; the rest run
- claim failed otherwise (a
  missing grant, a schema bug)  → nack with requeue, and the consumer stops
                                  with that one line (exit 2): it cannot heal,
                                  and no valid job is failed for it
- intake stopped (SIGTERM)      → nack with requeue

A message is acked only after its claim is durable: dying before the claim
leaves an unacked message that RabbitMQ redelivers; dying after it leaves an
active row whose lease the reaper handles. Deliveries wait in an inbox in
arrival order; one loop claims whatever arrived during the previous claim's
round trip in one statement and settles it with one ``multiple=True`` ack.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Callable

from jobq.amqp.deliveries import Settleable
from jobq.db import is_data_error, is_transient
from jobq.errors import ConfigError
from jobq.rows import Claim
from jobq.runtime import crash
from jobq.runtime.backoff import Backoff
from jobq.telemetry.logs import fields
from jobq.worker import handback
from jobq.worker.acks import Acks, Envelope, settle_one
from jobq.worker.misses import explain_misses, tell_malformed
from jobq.worker.store import WorkerStore
from jobq.worker.tally import Tally

log = logging.getLogger("jobq.consumer")

CLAIM_BATCH_MAX = 256  # ids claimed by one statement at most
CLAIM_TRIES = 6  # a failed batch is tried again this often (50 ms .. 1.6 s apart)

Batch = list[tuple[uuid.UUID, Envelope]]


class Intake:
    def __init__(self, store: WorkerStore, queues: list[str], slots: asyncio.Semaphore,
                 stop: asyncio.Event, tally: Tally,
                 start_job: Callable[[Claim, float], None],
                 on_claimed: Callable[[], None] | None = None,
                 hand_back: handback.Publish | None = None) -> None:
        self.store = store
        self.queues = queues
        self._slots = slots
        self._stop = stop
        self.tally = tally
        self._start_job = start_job  # the executor's: runs a claimed row
        self._on_claimed = on_claimed  # before a batch with a claim starts (consumer.py)
        self._handback = None if hand_back is None else handback.HandBack(
            hand_back, queues, tally)  # held ids back to the fleet, one message each
        self._inbox: collections.deque[Envelope] = collections.deque()
        self._ready = asyncio.Event()
        self._acks = Acks(self._inbox)
        self.retries: set[asyncio.Task[None]] = set()  # batches whose claim is retried
        self.fatal: ConfigError | None = None  # a claim error that cannot heal

    def on_message(self, msg: Settleable) -> None:
        # A plain function: called in aiormq's delivery task (deliveries.py).
        env = Envelope(msg)
        if env.bad:
            tell_malformed(self.tally, env)
        self._inbox.append(env)
        self._ready.set()

    def wake(self) -> None:
        self._ready.set()

    async def loop(self) -> None:
        """The only claimer. Jobs run in tasks the executor owns, not in
        aio-pika's callback tasks: those are cancelled when a channel closes,
        and a job must outlive that (its handler only needs the database)."""
        while True:
            if not self._inbox and not self._stop.is_set() and self.fatal is None:
                self._ready.clear()
                await self._ready.wait()
            if self.fatal is not None or self._stop.is_set():
                envs = list(self._inbox)
                self._inbox.clear()
                for env in envs:
                    await self._acks.finish(env, requeue=True)
                if self.fatal is not None:
                    raise self.fatal
                return
            batch = await self._take_batch()
            if batch:
                await self._claim_and_start(batch)

    async def _take_batch(self) -> Batch:
        """Ids from the front of the inbox, one free slot each."""
        batch: Batch = []
        inbox = self._inbox
        while inbox and len(batch) < CLAIM_BATCH_MAX:
            env = inbox[0]
            if not env.ids:  # malformed (logged at delivery)
                inbox.popleft()
                await settle_one(env.msg.reject(requeue=False))
                continue
            if self._slots.locked():
                if batch:
                    break
                got = await self._wait_for_slot()
                if got is None:  # no slot freed for a while: hand back what is held
                    assert self._handback is not None  # only it makes the wait time out
                    await self._handback.give(inbox, self._acks)
                    continue
                if not got:
                    break
            else:
                await self._slots.acquire()  # free: returns at once
            batch.append((env.ids[env.taken], env))
            env.taken += 1
            if not env.waiting:
                inbox.popleft()
        self._acks.taken(e for _, e in batch)
        return batch

    async def _wait_for_slot(self) -> bool | None:
        """Block for a slot, unless intake stops first (then False); None
        once handback.py's patience runs out while ids could be handed back."""
        acquire = asyncio.ensure_future(self._slots.acquire())
        stopped = asyncio.ensure_future(self._stop.wait())
        timeout = None if self._handback is None else self._handback.patience(self._inbox)
        try:
            await asyncio.wait({acquire, stopped}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not acquire.done():
                acquire.cancel()
        if acquire.done() and not acquire.cancelled():
            if not self._stop.is_set():
                return True
            self._slots.release()
            return False
        return None if not self._stop.is_set() and timeout is not None else False

    async def _claim_and_start(self, batch: Batch) -> None:
        crash.point("consumer.before_claim")
        sent_at = asyncio.get_running_loop().time()
        locks = [uuid.uuid4() for _ in batch]  # kept for a retry to recognise its own claim
        try:
            rows = await self._claim([i for i, _ in batch], locks)
        except Exception as exc:
            # Retried aside, so one failed claim never pauses intake (#19).
            task = asyncio.create_task(self._claim_later(batch, locks, sent_at, exc))
            self.retries.add(task)
            task.add_done_callback(self.retries.discard)
            return
        await self._started(batch, rows, sent_at)

    async def _started(self, batch: Batch, rows: list[Claim | None], sent_at: float) -> None:
        crash.point("consumer.after_claim")
        await self._acks.settle([e for _, e in batch], ack=True)
        if self._on_claimed is not None and any(r is not None for r in rows):
            self._on_claimed()
        for row in rows:
            if row is None:
                self._slots.release()
            else:
                self._start_job(row, sent_at)

    async def _claim_later(self, batch: Batch, locks: list[uuid.UUID], first_sent_at: float,
                           exc: Exception) -> None:
        """Retry a failed claim with the same tokens: rows the failed attempt
        did claim (its reply lost) come back as ours, with their lease timed
        from the first attempt's send, which is when the database set it."""
        backoff = Backoff(0.05, 1.6)
        for attempt in range(CLAIM_TRIES):
            if is_data_error(exc):
                await self._claim_one_by_one(batch, locks, first_sent_at)
                return
            if not is_transient(exc):
                await self._give_back(batch)
                self._fail_intake(exc)
                return
            if attempt == 0:
                self.tally.note("claim_retried", len(batch))
                log.warning("cannot claim %d job(s) now (%s); retrying them", len(batch), exc)
            if self._stop.is_set():
                break
            if attempt:  # the first retry at once: the usual cause, a dead pooled
                await backoff.sleep()  # connection, is already discarded
            try:
                rows = await self._claim([i for i, _ in batch], locks, retried=True)
            except Exception as again:
                exc = again
                continue
            await self._started(batch, rows, first_sent_at)
            return
        # Never drop: the messages go back and are redelivered.
        self.tally.note("claim_unavailable", len(batch))
        ids = ", ".join(str(i) for i, _ in batch[:3])
        more = f" and {len(batch) - 3} more" if len(batch) > 3 else ""
        log.warning("cannot claim %s%s: %s; message%s requeued", ids, more, exc,
                    "s" if len(batch) > 1 else "")
        await self._give_back(batch)

    async def _give_back(self, batch: Batch) -> None:
        for _ in batch:
            self._slots.release()
        await self._acks.settle([e for _, e in batch], ack=False)

    def _fail_intake(self, exc: Exception) -> None:
        """A claim error nothing here can heal: stop intake with it (the
        consumer exits with the one line; the orchestrator shows it)."""
        if self.fatal is None:
            self.fatal = exc if isinstance(exc, ConfigError) else ConfigError(
                f"claims fail with an error that retrying cannot heal: {exc}")
        self._ready.set()

    async def _claim_one_by_one(self, batch: Batch, locks: list[uuid.UUID],
                                first_sent_at: float) -> None:
        """A claim failed on data, not on the database: find who, fail only it."""
        for (job_id, env), lock in zip(batch, locks):
            try:
                rows = await self._claim([job_id], [lock], retried=True)
            except Exception as exc:
                self._slots.release()
                if not is_data_error(exc):
                    await self._acks.settle([env], ack=False)
                    if not is_transient(exc):
                        self._fail_intake(exc)
                    continue
                try:
                    failed = await self.store.quarantine(job_id, lock)
                except Exception as again:
                    log.warning("could not fail unclaimable job %s: %s", job_id, again)
                    await self._acks.settle([env], ack=False)
                    continue
                if not failed:  # the database found it claimable after all: again
                    await self._acks.settle([env], ack=False)
                    continue
                self.tally.drop("unclaimable")
                log.error("job %s cannot be claimed: %s; failed (check the queue's settings; "
                          "then jobq retry)", job_id, exc,
                          extra=fields(event="failed", job=job_id, quarantined=failed))
                await self._acks.settle([env], ack=True)
                continue
            await self._started([(job_id, env)], rows, first_sent_at)

    async def _claim(self, ids: list[uuid.UUID], locks: list[uuid.UUID],
                     retried: bool = False) -> list[Claim | None]:
        claimed = await self.store.claim(ids, locks, retried)
        rows, handed = claimed.rows, claimed.handed
        if handed:  # delivered jobs a higher priority overtook: back in line
            self.tally.note("overtaken", len(handed))
            await self.store.publish(handed)
        misses = [i for i, r in zip(ids, rows) if r is None]
        if misses:
            # The claims above are committed: failing to explain the misses
            # must not make us drop the rows we just claimed.
            try:
                await explain_misses(self.store, self.tally, self.queues, misses)
            except Exception as exc:
                log.warning("could not look up %d unclaimable id(s): %s", len(misses), exc)
        return rows
