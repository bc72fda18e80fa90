"""Typed task handles without services (issue #32): the handle is the
handler when called, encodes and checks its payload, runs in jobq.testing,
publishes into an InMemoryClient bound to its app from async and sync code,
and @app.periodic goes above it as above @app.handler."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

import jobq
from jobq.errors import ConfigError, InvalidPayload
from jobq.testing import InMemoryClient, run_job


class Invoice(BaseModel):
    number: int
    total: float


def make_app() -> tuple[jobq.App, jobq.Task[Invoice], jobq.Task[Any]]:
    app = jobq.App()

    @app.periodic(every=60)
    @app.task("invoices", payload=Invoice)
    async def send_invoice(job: jobq.Job[Invoice]) -> dict[str, float]:
        return {"n": job.payload.number, "total": job.payload.total}

    @app.task("plain")
    def plain(job: jobq.Job) -> object:
        return job.payload

    return app, send_invoice, plain


def test_the_handle_is_registered_and_calling_it_calls_the_handler() -> None:
    app, send_invoice, plain = make_app()
    assert app.handlers["invoices"].fn is send_invoice.fn
    assert app.handlers["invoices"].payload_model is Invoice and app.handlers["invoices"].is_async
    assert "invoices" in app.schedules  # @app.periodic above @app.task
    job = jobq.Job(id=uuid.uuid4(), queue="plain", payload={"x": 1}, attempt=1,
                   lock=uuid.uuid4(), worker_id="w")
    assert plain(job) == {"x": 1}
    assert repr(send_invoice) == "<jobq.Task send_invoice queue=invoices payload=Invoice>"


def test_payloads_are_encoded_as_json_and_checked_against_the_model() -> None:
    _, send_invoice, plain = make_app()
    assert send_invoice.encode(Invoice(number=7, total=9.5)) == {"number": 7, "total": 9.5}
    assert send_invoice.encode({"number": "7", "total": 1}) == {"number": 7, "total": 1.0}
    with pytest.raises(InvalidPayload, match=r"does not fit Invoice: 1 error\(s\): "
                       r"Field required at total;"):
        send_invoice.encode({"number": 7})
    with pytest.raises(InvalidPayload) as two:  # every mistake, not only the first
        send_invoice.encode({"number": "seven"})
    assert "2 error(s)" in str(two.value) and " at number" in str(two.value) \
        and "Field required at total" in str(two.value), two.value
    assert plain.encode({"any": ["json"]}) == {"any": ["json"]}
    new = send_invoice.job(Invoice(number=1, total=2), priority=3, key="k", delay_s=5)
    assert (new.queue, new.payload, new.priority, new.key, new.delay_s) == (
        "invoices", {"number": 1, "total": 2.0}, 3, "k", 5)


def test_a_handle_runs_in_memory_and_publishes_into_a_bound_client() -> None:
    app, send_invoice, _ = make_app()
    client = InMemoryClient().bind(app)

    async def go() -> None:
        assert await run_job(app, send_invoice, Invoice(number=4, total=1)) == {
            "n": 4, "total": 1.0}
        await send_invoice.publish(Invoice(number=1, total=10))
        await asyncio.to_thread(send_invoice.publish_sync, Invoice(number=2, total=20),
                                priority=9)
        assert [j.payload["number"] for j in client.jobs("invoices")] == [1, 2]
        assert client.jobs()[1].priority == 9
        results = await client.run_all(app)
        assert sorted(r["n"] for r in results.values()) == [1, 2]

    asyncio.run(go())


def test_a_bad_payload_publishes_nothing() -> None:
    app, send_invoice, _ = make_app()
    client = InMemoryClient().bind(app)
    with pytest.raises(InvalidPayload, match="pass a valid Invoice"):
        send_invoice.publish_sync({"number": "seven", "total": 1})  # type: ignore[arg-type]
    assert client.published == []


def test_a_queue_has_one_handler_whichever_decorator_registered_it() -> None:
    app, _, _ = make_app()
    with pytest.raises(ConfigError, match="already has a handler"):
        app.task("invoices")(lambda job: None)


def test_every_single_publish_takes_the_options_a_newjob_has() -> None:
    """Client.publish had no ``after`` (the docs and the contract name
    ``client.publish(queue, payload, after=[...])``) while SyncClient.publish
    and the task handles had it: a user's call failed with a TypeError. Each
    single publish must take every option of NewJob but the workflow's own."""
    import dataclasses
    import inspect

    from jobq.newjob import OPTIONS, JobOptions
    from jobq.testing import InMemoryClient

    # issue #48: the options are declared once (JobOptions); each publish
    # takes them as **options: Unpack[JobOptions], and NewJob has each one
    assert {f.name for f in dataclasses.fields(jobq.NewJob)} - {
        "queue", "payload", "workflow_id"} == OPTIONS
    publishes: list[Any] = [jobq.Client.publish, jobq.Client.enqueue, jobq.SyncClient.publish,
                            jobq.Task.publish, jobq.Task.publish_sync, jobq.Task.job,
                            InMemoryClient.publish, InMemoryClient.publish_sync,
                            InMemoryClient.enqueue]
    for publish in publishes:
        options = inspect.signature(publish).parameters["options"]
        assert options.kind is inspect.Parameter.VAR_KEYWORD
        assert options.annotation == f"Unpack[{JobOptions.__name__}]", publish.__qualname__
    with pytest.raises(TypeError, match="unexpected keyword argument 'workflow_id'"):
        InMemoryClient().publish_sync("q", {}, workflow_id=None)  # type: ignore[call-arg]


def test_a_typed_tasks_jobs_are_steps_of_a_workflow() -> None:
    """Task.job's docstring sent users to ``workflow.add(task.job(...))``,
    which did not exist. Now it does, keeping the job's options."""
    app, send_invoice, plain = make_app()
    client = InMemoryClient().bind(app)
    wf = jobq.Workflow()
    first = wf.add(send_invoice.job(Invoice(number=1, total=5), priority=7))
    last = wf.add(plain.job({"x": 1}, key="k"), after=[first])
    assert [(j.priority, j.key) for j in wf.jobs()] == [(7, None), (0, "k")]

    async def go() -> dict[uuid.UUID, Any]:
        await client.publish_workflow(wf)
        return await client.run_all(app)

    results = asyncio.run(go())
    assert client.jobs("plain")[0].after == (first.id,)
    assert results == {first.id: {"n": 1, "total": 5.0}, last.id: {"x": 1}}
