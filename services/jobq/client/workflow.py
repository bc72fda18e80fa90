"""Workflows (issue #31): jobs that wait for other jobs, declared as a small
DAG and published in one transaction.

    wf = jobq.Workflow()
    resize = wf.step("resize", {"img": 7})
    upload = wf.step("upload", {"img": 7}, after=[resize])
    wf.step("notify", {"img": 7}, after=[upload])
    workflow_id = await client.publish_workflow(wf)

A step can wait only for steps declared before it (or for jobs that already
exist), so a cycle cannot be written. Every step is a row of its own
(``jobq.job``, ``workflow_id`` set); the database releases a waiting step
when the last job it waits for completes, exactly once, whoever races or
dies (the trigger in schema/0014), and cancels it, with the reason, when one
of them fails or is cancelled. No coordinator process, no polling job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import asyncpg
from typing_extensions import Unpack

from jobq.client import store
from jobq.db import PooledConnection, connection
from jobq.errors import BadInput
from jobq.newjob import NewJob, options_of
from jobq.telemetry import tracing


class StepOptions(TypedDict, total=False):
    """A step's options: a job's (newjob.JobOptions) but ``after``, which
    ``Workflow.step`` takes as steps or ids."""

    delay_s: float
    idempotency_key: str | None
    priority: int
    key: str | None
    debounce_s: float


@dataclass(frozen=True, eq=False)
class Step:
    """A step of a workflow not published yet; its job id once it is."""

    index: int
    queue: str
    payload: Any
    after: tuple[Step | uuid.UUID, ...]
    options: dict[str, Any]
    workflow: Workflow

    @property
    def id(self) -> uuid.UUID:
        """The step's job id (after ``client.publish_workflow``)."""
        if self.workflow.ids is None:
            raise BadInput("a step has a job id once its workflow is published")
        return self.workflow.ids[self.index]


@dataclass(eq=False)
class Workflow:
    id: uuid.UUID = field(default_factory=uuid.uuid4)
    steps: list[Step] = field(default_factory=list)
    ids: list[uuid.UUID] | None = None

    def step(self, queue: str, payload: Any = None, *,
             after: Sequence[Step | uuid.UUID] = (), **options: Unpack[StepOptions]) -> Step:
        """Declare a step: a job of ``queue`` that runs once each of ``after``
        (steps of this workflow, or ids of existing jobs) completed. Options
        as for ``Client.publish`` (priority, key, delay_s, idempotency_key)."""
        options_of({**options}, "step")
        if self.ids is not None:
            raise BadInput("this workflow is published already: declare a new one")
        for a in after:
            if isinstance(a, Step) and (a.workflow is not self or a.index >= len(self.steps)):
                raise BadInput("a step can wait only for steps declared before it in the "
                               "same workflow (or for job ids)")
        s = Step(len(self.steps), queue, payload, tuple(after), dict(options), self)
        self.steps.append(s)
        return s

    def add(self, job: NewJob, *, after: Sequence[Step | uuid.UUID] = ()) -> Step:
        """Declare a step from a :class:`jobq.NewJob`, e.g. a typed task's
        ``task.job(payload, priority=5)``: its queue, payload and options,
        waiting for ``after`` (steps of this workflow) and the job's own."""
        options = job.options()
        options.pop("after", None)
        own: StepOptions = {**options}  # type: ignore[typeddict-unknown-key]
        return self.step(job.queue, job.payload, after=[*job.after, *after], **own)

    def jobs(self) -> list[NewJob]:
        """The steps as jobs; ``bind`` maps each to its id afterwards. A step
        waiting for an earlier step refers to it by its position, resolved
        as the batch is enqueued (enqueue_linked)."""
        if not self.steps:
            raise BadInput("a workflow needs at least one step")
        return [NewJob(s.queue, s.payload, workflow_id=self.id,
                       after=tuple(_Ref(a.index) if isinstance(a, Step) else a for a in s.after),
                       **s.options) for s in self.steps]

    def bind(self, ids: list[uuid.UUID]) -> None:
        self.ids = list(ids)


class _Ref(uuid.UUID):
    """Stands for the id of an earlier job of the same batch (by position)."""

    index: int

    def __init__(self, index: int) -> None:
        super().__init__(int=index)
        object.__setattr__(self, "index", index)


async def enqueue_linked(pool: asyncpg.Pool, jobs: Sequence[NewJob], payloads: Sequence[str],
                         relay_grace_s: float) -> list[uuid.UUID]:
    """Enqueue jobs one by one, in order, in one transaction: a job's
    ``after`` may name an earlier job of the batch (a workflow's step)."""
    ids: list[uuid.UUID] = []
    async with connection(pool) as conn, conn.transaction():
        for job, text in zip(jobs, payloads):
            ids.append(await enqueue_one(conn, job, text, resolved(job.after, ids),
                                         relay_grace_s))
    return ids


def resolved(after: Sequence[uuid.UUID], ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """``after`` with each reference to an earlier job of the batch (a
    workflow's step, by position) replaced by that job's id in ``ids``."""
    return [ids[a.index] if isinstance(a, _Ref) else a for a in after]


async def enqueue_one(conn: asyncpg.Connection | PooledConnection, job: NewJob, text: str,
                      after: Sequence[uuid.UUID], relay_grace_s: float) -> uuid.UUID:
    """One job through jobq.enqueue, in the caller's transaction (it locks
    and counts the parents there)."""
    # A job that waits is never published by a client: whoever releases it
    # hands it to the relay. If its parents all completed already, that is
    # now (grace 0: relayed at once, a reaper woken by NOTIFY), not after
    # the grace a client-published job gets.
    grace = 0.0 if after else relay_grace_s
    return await store.insert_linked(conn, job, text, after, grace, tracing.carrier())
