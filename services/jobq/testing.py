"""Test your own handlers without PostgreSQL or RabbitMQ (issue #32).

    from jobq.testing import InMemoryClient, run_job

    async def test_welcome_email():
        result = await run_job(app, "emails", {"to": "a@b.c"})
        assert result == {"sent": 1}

``run_job`` runs a handler as a consumer would, in memory: the payload is validated
by the handler's model, a sync handler runs in a thread, ``job.progress`` records
values and ``job.emit`` chunks (``MemoryJob.output``), ``job.step`` runs each step
once per job (a second ``run_job`` of the same ``MemoryJob`` returns stored steps, as
a re-run after a crash would), ``job.parents()`` returns what you give, and ``Retry``
/ ``Fail`` / ``Snooze`` / ``RateLimited`` / any other exception propagates, for
``pytest.raises``. ``job.sleep`` returns at once (``MemoryJob.slept`` lists the
sleeps); ``job.wait_for`` returns a signal given with ``MemoryJob.signal(name,
payload)``, and without one raises ``jobq.errors.Suspended``: signal the job and run
it again. ``job.spawn`` records the child once per name (``MemoryJob.spawned``: name
-> queue, payload, id); ``job.join`` returns ``MemoryJob.results[id]`` of each, and
suspends until a test gives them all.

``InMemoryClient`` records what code under test publishes (the async client's
``publish`` / ``publish_many`` and the ``SyncClient``'s, without ``await``;
``client.bind(app)`` also takes what ``app``'s task handles publish;
``publish_workflow`` and ``enqueue`` too) and can run it: ``await
client.run_all(app)`` runs every recorded job whose handler ``app`` has and that has
not run yet, in publish order, then what those published, and returns their results.
The pytest fixture ``jobq_client`` (``pytest -p jobq.testing``, or import it in a
conftest) gives one per test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import Unpack

from jobq.app import App
from jobq.client.task import Task
from jobq.client.workflow import Workflow, resolved
from jobq.errors import BadInput, Suspended
from jobq.job import Job
from jobq.newjob import JobOptions, NewJob, new_job, validate
from jobq.worker.steps import fn_name


@dataclass
class _Memory:
    """What a test job keeps between runs (steps, progress, output, signals,
    children), and what its handler reaches through it, as a consumer's link."""

    steps: dict[str, tuple[str, Any]] = field(default_factory=dict)
    progress: list[Any] = field(default_factory=list)
    parent_results: dict[uuid.UUID, Any] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)
    slept: list[str] = field(default_factory=list)
    spawned: dict[str, tuple[str, Any, uuid.UUID]] = field(default_factory=dict)
    results: dict[uuid.UUID, Any] = field(default_factory=dict)
    output: list[Any] = field(default_factory=list)

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        who = fn_name(fn)
        if name in self.steps:
            recorded, value = self.steps[name]
            if recorded != who:
                raise BadInput(f"step {name!r} was recorded by {recorded}, not {who}")
            return value
        value = await fn(*args) if asyncio.iscoroutinefunction(fn) else fn(*args)
        try:  # stored as JSON, as the database stores it
            stored = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise BadInput(f"step {name!r}: the result is not JSON ({exc})") from None
        self.steps[name] = (who, stored)
        return stored

    def step_sync(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        return asyncio.run(self.step(name, fn, *args))

    async def set(self, value: Any) -> None:  # job.progress
        self.progress.append(value)

    async def emit(self, chunk: Any) -> int:
        self.output.append(json.loads(json.dumps(chunk, allow_nan=False)))
        return len(self.output)

    def emit_sync(self, chunk: Any) -> int:
        return asyncio.run(self.emit(chunk))

    async def parents(self) -> dict[uuid.UUID, Any]:
        return dict(self.parent_results)

    async def sleep(self, name: str, seconds: float) -> None:
        self.slept.append(name)  # no time passes in a test

    async def wait_for(self, name: str, timeout_s: float | None) -> Any:
        if name not in self.signals:
            raise Suspended(None, name, f"waiting for signal {name!r} (signal the MemoryJob "
                            "and run it again)")
        return self.signals[name]

    async def spawn(self, name: str, queue: str, payload: Any, **options: Any) -> uuid.UUID:
        return self.spawned.setdefault(name, (queue, payload, uuid.uuid4()))[2]

    async def join(self, ids: Any) -> list[Any]:
        wanted = [uuid.UUID(str(i)) for i in ids]
        if any(i not in self.results for i in wanted):
            raise Suspended(None, None, "joining children (give MemoryJob.results[child_id] "
                            "and run it again)", joining=wanted)
        return [self.results[i] for i in wanted]


@dataclass
class MemoryJob:
    """A job to run in memory; keep it to run it again (attempt + 1)."""

    queue: str
    payload: Any = None
    attempt: int = 1
    id: uuid.UUID = field(default_factory=uuid.uuid4)
    parents: dict[uuid.UUID, Any] = field(default_factory=dict)
    memory: _Memory = field(default_factory=_Memory)

    @property
    def progress(self) -> list[Any]:
        return self.memory.progress

    @property
    def steps(self) -> dict[str, Any]:
        return {k: v for k, (_, v) in self.memory.steps.items()}

    @property
    def output(self) -> list[Any]:
        """What ``job.emit`` streamed, every run's, in order."""
        return self.memory.output

    @property
    def slept(self) -> list[str]:
        return self.memory.slept

    @property
    def spawned(self) -> dict[str, tuple[str, Any, uuid.UUID]]:
        return self.memory.spawned

    @property
    def results(self) -> dict[uuid.UUID, Any]:
        """What ``job.join`` returns for each child id (set by the test)."""
        return self.memory.results

    def signal(self, name: str, payload: Any = None) -> bool:
        """As ``client.signal``: kept for every later run; the first of a name wins."""
        if name in self.memory.signals:
            return False
        self.memory.signals[name] = json.loads(json.dumps(payload))
        return True


async def run_job(app: App, queue_or_job: str | MemoryJob | Task[Any],
                  payload: Any = None) -> Any:
    """Run the handler of a queue (or a MemoryJob again) in memory; its result."""
    if isinstance(queue_or_job, Task):  # a handle: its queue, its payload as published
        queue_or_job, payload = queue_or_job.queue, queue_or_job.encode(payload)
    tj = queue_or_job if isinstance(queue_or_job, MemoryJob) else MemoryJob(queue_or_job, payload)
    if tj.queue not in app.handlers:
        raise BadInput(f"the app has no handler for queue {tj.queue!r}")
    text = validate(NewJob(tj.queue, tj.payload))  # what publish would refuse
    handler, text = app.route(tj.queue, text)  # a named task's handler and its own payload
    tj.memory.parent_results = dict(tj.parents)
    job = Job(id=tj.id, queue=tj.queue, payload=json.loads(text), attempt=tj.attempt,
              lock=uuid.uuid4(), worker_id="jobq-testing")
    if handler.payload_model is not None:
        job.payload = handler.payload_model.model_validate(job.payload)
    job.attach_progress(tj.memory)
    job.attach_link(tj.memory)
    async def call() -> Any:  # inside the app's middleware and end hooks, as consumed
        if handler.is_async:
            return await handler.fn(job)
        return await asyncio.to_thread(handler.fn, job)
    try:
        return await app.hooks.run(job, call)
    finally:
        tj.attempt += 1


RUN_ALL_MAX = 10_000  # jobs one run_all runs before it calls it a loop


class InMemoryClient:
    """Records publishes instead of sending them; runs them on request."""

    def __init__(self) -> None:
        self.published: list[tuple[uuid.UUID, NewJob]] = []
        self.results: dict[uuid.UUID, Any] = {}  # of every job run_all ran
        self._ran: set[uuid.UUID] = set()
        self._lock = threading.Lock()

    def _record(self, jobs: Iterable[NewJob]) -> list[uuid.UUID]:
        out: list[uuid.UUID] = []
        for j in jobs:
            validate(j)  # the same refusals as the real client's
            if j.after:  # a workflow's step may wait for an earlier one of the batch
                j = dataclasses.replace(j, after=tuple(resolved(j.after, out)))
            job_id = uuid.uuid4()
            with self._lock:
                self.published.append((job_id, j))
            out.append(job_id)
        return out

    async def publish(self, queue: str, payload: Any = None,
                      **options: Unpack[JobOptions]) -> uuid.UUID:
        (job_id,) = self._record([new_job(queue, payload, options)])
        return job_id

    async def publish_many(self, jobs: Iterable[NewJob], *,
                           relay: bool = False) -> list[uuid.UUID]:
        return self._record(jobs)  # relay or not, recorded alike

    async def enqueue(self, conn: Any, queue: str, payload: Any = None,
                      **options: Unpack[JobOptions]) -> uuid.UUID:
        """``Client.enqueue`` in the caller's transaction: recorded (``conn``
        is not used: there is no database here)."""
        return await self.publish(queue, payload, **options)

    def publish_sync(self, queue: str, payload: Any = None,
                     **options: Unpack[JobOptions]) -> uuid.UUID:
        (job_id,) = self._record([new_job(queue, payload, options)])
        return job_id

    async def publish_workflow(self, workflow: Workflow) -> uuid.UUID:
        return self.publish_workflow_sync(workflow)

    def publish_workflow_sync(self, workflow: Workflow) -> uuid.UUID:
        """``SyncClient.publish_workflow``: the steps recorded, their ids bound."""
        workflow.bind(self._record(workflow.jobs()))
        return workflow.id

    def bind(self, app: App) -> InMemoryClient:
        """Make ``app``'s task handles (``@app.task``) publish here, from
        ``publish`` and ``publish_sync`` alike."""
        app.clients.stand_in(self, _SyncView(self))
        return self

    def jobs(self, queue: str | None = None) -> list[NewJob]:
        """What was published (to ``queue``), in order."""
        return [j for _, j in self.published if queue is None or j.queue == queue]

    async def run_all(self, app: App) -> dict[uuid.UUID, Any]:
        """Run every recorded job that ``app`` handles and that has not run
        yet, in publish order, and what those publish in turn, as the
        consumers would; their results. A job's ``job.parents()`` gets the
        results of the jobs it waits for."""
        results: dict[uuid.UUID, Any] = {}
        while True:
            todo = [(i, j) for i, j in list(self.published)
                    if i not in self._ran and j.queue in app.handlers]
            if not todo:
                return results
            if len(results) >= RUN_ALL_MAX:  # a test that hangs says nothing
                raise BadInput(f"run_all ran {len(results)} jobs and more keep coming: a "
                               f"handler publishes jobs that publish again ({todo[0][1].queue})")
            for job_id, j in todo:
                self._ran.add(job_id)
                tj = MemoryJob(j.queue, j.payload, id=job_id,
                               parents={p: self.results.get(p) for p in j.after})
                results[job_id] = self.results[job_id] = await run_job(app, tj)


class _SyncView:
    """An InMemoryClient as a task's ``publish_sync`` calls a SyncClient."""

    def __init__(self, memory: InMemoryClient) -> None:
        self.memory = memory

    def publish_many(self, jobs: Iterable[NewJob], *, relay: bool = False) -> list[uuid.UUID]:
        return self.memory._record(jobs)

    def publish_workflow(self, workflow: Workflow) -> uuid.UUID:
        return self.memory.publish_workflow_sync(workflow)


try:  # the pytest fixture, when pytest is there
    import pytest

    @pytest.fixture
    def jobq_client() -> InMemoryClient:
        """An InMemoryClient for one test."""
        return InMemoryClient()
except ImportError:  # pragma: no cover - pytest is a test dependency
    pass
