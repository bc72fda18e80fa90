"""Runs claimed jobs: one task per job, from its claim to its end.

Each run is tracked by the heartbeat from the moment it exists, so whatever
happens next — a payload that cannot be decoded, a handler error, a child
process that dies, a bug in jobq itself — ends in a recorded state: complete,
fail, retry, release or a charged child death. Never "the task died, wait
for the lease" (issue #19).

Where execution modes differ, and nowhere else (:meth:`Executor._call`):
async handlers run on the event loop; sync handlers in a thread pool
(``--pool thread``, the default) or in child processes (``--pool
process``, ``processes.py``).

Suspects (jobs present at two crashes, see ``requeue_lapsed`` in
``queries.sql``) run *isolated*: at most one per worker at a time, marked in
its row, while the other slots keep running other jobs. A suspect that finds
another one isolated here waits up to ``SUSPECT_WAIT_S`` for its turn, then
is handed on to another worker (at most ``MAX_HANDOFFS`` times, then it
waits). In process mode sync handlers need no isolation: a child's death
names its job exactly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import json
import logging
import uuid
from types import MappingProxyType
from typing import Any

from jobq.handlers import Handlers, RunEnd
from jobq.job import Job
from jobq.lease import Lease
from jobq.rows import Claim
from jobq.runtime import crash
from jobq.runtime.loops import RunningLoop
from jobq.settings import ConsumerSettings
from jobq.telemetry import current, tracing
from jobq.telemetry.logs import fields
from jobq.worker.completer import Completer
from jobq.worker.heartbeat import Heartbeat
from jobq.worker.processes import ChildDied, ProcessPool
from jobq.worker.progress import ProgressWriter
from jobq.worker.run import Run, Stop
from jobq.worker.store import WorkerStore
from jobq.worker.tally import Tally
from jobq.worker.verdicts import JobqFault, JobTimeout, PayloadUndecodable

log = logging.getLogger("jobq.consumer")


SUSPECT_WAIT_S = 2.0
MAX_HANDOFFS = 2


class Executor:
    def __init__(self, app: Handlers, cfg: ConsumerSettings, concurrency: int, worker_id: str,
                 store: WorkerStore, heartbeat: Heartbeat, completer: Completer,
                 tally: Tally, slots: asyncio.Semaphore,
                 processes: ProcessPool | None = None) -> None:
        self.app = app
        self.cfg = cfg
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.store = store
        self.heartbeat = heartbeat
        self.completer = completer
        self.tally = tally
        # The one owner of this process's runs: added at the claim, removed at
        # their end (or by forget(), after the drain released them); the
        # heartbeat reads them through a view that cannot change them.
        self.runs: dict[uuid.UUID, Run] = {}
        heartbeat.watch(MappingProxyType(self.runs))
        self._slots = slots
        self._processes = processes
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=cfg.sync_threads or concurrency, thread_name_prefix="jobq-handler")
        self._isolation = asyncio.Lock()  # held by the one suspect running isolated here
        self.tasks: set[asyncio.Task[None]] = set()
        self._loop = RunningLoop()

    def start(self, row: Claim, sent_at: float) -> None:
        """Run a claimed row; its slot is released when the run ends."""
        task = self._loop().create_task(self._job(row, sent_at))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _job(self, row: Claim, sent_at: float) -> None:
        run = None
        try:
            run = self._track(row, sent_at)
            await self._run(run, row)
        except Exception as exc:
            log.exception("jobq error while running job %s", row.id)
            if run is not None and run.ours:
                # Our own bug must not cost the job a lease wait and a stall,
                # nor loop: it is a failure of this run (an attempt counted,
                # the queue's backoff, failed at max_attempts). Released, it
                # came straight back to the same error: one malformed trace
                # record made a job loop ~110 times a second (I11).
                await self.completer.fail(run, JobqFault(f"jobq error in the consumer: "
                                                         f"{type(exc).__name__}: {exc}"))
                self.runs.pop(run.job.id, None)
        finally:
            self._slots.release()

    def _track(self, row: Claim, sent_at: float) -> Run:
        le = Lease.from_claim(row, sent_at, self.cfg.fence_margin_fraction)
        job = Job(id=row.id, queue=row.queue, payload=None, attempt=row.attempts,
                  lock=row.lock, worker_id=self.worker_id, stalls=row.stalls,
                  created_at=row.created_at)
        handler, run_payload = self.app.route(row.queue, row.payload)  # named tasks: the row's
        run = Run(job, le, handler)
        run.payload_text = run_payload
        self.runs[job.id] = run
        self.heartbeat.track(run)  # from here on the lease is renewed and fenced
        self.tally.count("claimed", job.queue)
        if log.isEnabledFor(logging.INFO):
            log.info("claimed", extra=fields(event="claimed", job=job.id, queue=job.queue,
                                             attempt=job.attempt, worker=self.worker_id))
        return run

    async def _run(self, run: Run, row: Claim) -> None:
        loop = self._loop()
        started = loop.time()
        isolated = False
        outcome = "ok"
        progress: ProgressWriter | None = None
        try:
            if not self._in_child(run):  # else the child decodes and checks it (child.py)
                try:
                    run.job.payload = json.loads(run.payload_text)
                except (ValueError, RecursionError) as exc:
                    outcome = "error"
                    await self.completer.fail(run, PayloadUndecodable(
                        f"{type(exc).__name__}: {str(exc)[:200]}"))
                    return
            if row.suspect and self._isolates(run):
                isolated = await self._isolate(run, row.handoffs)
                if not isolated:
                    outcome = (run.stop_reason or Stop.LOST).value
                    return
            run.max_result_bytes = row.max_result_bytes
            run.limited = row.limited
            progress = ProgressWriter(self.store, run, self.heartbeat)
            run.job.attach_progress(progress)
            run.job.attach_link(self.store.link(run.job.id, run.job.lock, run.max_result_bytes))
            timeout_s = run.handler.policy.timeout_s or row.timeout_s  # the handler's first
            if timeout_s:
                run.timeout = loop.call_later(float(timeout_s), run.stop, Stop.TIMEOUT)
            stored = await self._trace_of(run) if tracing.enabled() else None
            with tracing.run_span(run.job, stored, self.worker_id) as traced:
                with current.running(run.job, self.worker_id, tracing.trace_id()):
                    outcome = await self._execute(run)
                traced(outcome)
        finally:
            if progress is not None:
                progress.close()  # nothing may land after the job's end
            if isolated:
                self._isolation.release()
            took = loop.time() - started
            self.tally.handler_time(run.job.queue, outcome, took)
            run.disarm()
            if run.stop_reason is not Stop.SHUTDOWN:
                self.runs.pop(run.job.id, None)  # shutdown: the drain releases it
            if self.app.hooks.end_hooks:  # the user's code, once the run is written
                await self.app.hooks.ended(RunEnd(run.job, outcome, took, run.error))

    async def _trace_of(self, run: Run) -> str | None:
        """The publisher's trace context (tracing.py); None if none or unreadable."""
        try:
            return await self.store.trace_of(run.job.id)
        except Exception as exc:  # telemetry: the job runs all the same
            log.debug("trace context of %s: %r", run.job.id, exc)
            return None

    def _in_child(self, run: Run) -> bool:
        """Its handler runs in a child process (--pool process, sync)."""
        return self._processes is not None and not run.handler.is_async

    def _isolates(self, run: Run) -> bool:
        if self.concurrency == 1:
            return False  # it runs alone anyway
        return not self._in_child(run)

    async def _isolate(self, run: Run, handoffs: int) -> bool:
        """Take this worker's isolation for a suspect; False if it went away."""
        acquire = asyncio.ensure_future(self._isolation.acquire())
        run.task = acquire  # a stop (lease lost, shutdown) cancels the wait
        await asyncio.wait({acquire}, timeout=SUSPECT_WAIT_S if handoffs < MAX_HANDOFFS else None)
        run.task = None
        if not acquire.done():
            acquire.cancel()
            if run.stop(Stop.HANDED_ON):
                await self.completer.release(
                    [run], "suspect: this worker isolates another suspect; handed on",
                    handoff=True)
            return False
        if acquire.cancelled() or not run.ours:
            if not acquire.cancelled():
                self._isolation.release()
            return False
        ok = await self.completer.fenced(run, "isolation",
                                         lambda: self.store.isolate(run.lease))
        if ok is True:
            log.info("suspect job: running it isolated", extra=fields(
                event="isolated", job=run.job.id, queue=run.job.queue, worker=self.worker_id))
            return True
        self._isolation.release()
        if ok is False:
            self.heartbeat.lose(run, "isolation rejected")
        return False

    async def _execute(self, run: Run) -> str:
        """Call the handler and record how it ended; returns the outcome label."""
        try:
            if run.handler.payload_model is not None and not self._in_child(run):
                run.job.payload = run.handler.payload_model.model_validate(run.job.payload)
            run.task = self._loop().create_task(self.app.hooks.call(run.job,
                                                                    lambda: self._call(run)))
            value = await run.task
        except BaseException as exc:
            run.error = exc
            if run.stop_reason is not None:
                return await self._after_stop(run)
            if isinstance(exc, asyncio.CancelledError):
                raise  # not a stop of ours: this task itself is being cancelled
            if isinstance(exc, ChildDied):
                await self.completer.child_died(run, str(exc))
                return "child_died"
            await self.completer.fail(run, exc)
            return "error"
        if run.stop_reason is not None:
            return await self._after_stop(run)
        crash.point("consumer.after_handler")
        if run.job.completed_in_transaction:
            self.completer.completed_by_handler(run)  # job.complete_in(conn) committed it
        else:
            await self.completer.complete(run, value)
        return "ok"

    async def _call(self, run: Run) -> Any:
        handler, job = run.handler, run.job
        if handler.is_async:
            return await handler.fn(job)
        if self._processes is not None:
            return await self._processes.call(run, _job_fields(job, run.payload_text,
                                                               run.handler.task))
        loop = self._loop()
        context = contextvars.copy_context()  # the job's log fields and span, in the thread
        return await loop.run_in_executor(self._threads,
                                          functools.partial(context.run, handler.fn, job))

    async def _after_stop(self, run: Run) -> str:
        reason = run.stop_reason
        assert reason is not None
        if reason is Stop.TIMEOUT:
            await self.completer.fail(run, JobTimeout(
                "job timeout: the handler ran past its timeout_s (the handler's, else the "
                "queue's) and was stopped"))
        elif reason is Stop.LOST:
            log.info("handler stopped (%s)", run.lease.lost, extra=fields(
                event="stopped", job=run.job.id, queue=run.job.queue, attempt=run.job.attempt,
                worker=self.worker_id))
        # SHUTDOWN: the drain releases every such run in one statement.
        return reason.value

    def forget(self, runs: list[Run]) -> None:
        """The drain released these: they are no longer this process's."""
        for run in runs:
            self.runs.pop(run.job.id, None)

    def stop_all(self, reason: Stop) -> list[Run]:
        """Stop every run still going (the drain); returns them."""
        left = list(self.runs.values())
        for run in left:
            run.stop(reason)
        return left

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


def _job_fields(job: Job, payload_text: str, task: str | None) -> dict[str, Any]:
    """What a child process needs to rebuild the Job (no event, no lock
    object); the payload as the row's JSON text (a named task's own part),
    decoded by the child, which finds the handler by queue and task."""
    return {"id": job.id, "queue": job.queue, "payload_text": payload_text, "task": task,
            "attempt": job.attempt,
            "lock": job.lock, "worker_id": job.worker_id, "stalls": job.stalls,
            "created_at": job.created_at, "trace_id": tracing.trace_id()}


__all__ = ["Executor"]
