"""OpenTelemetry and log context (issue #32), with an in-process consumer and
the SDK's in-memory exporter: a run is a ``jobq.run`` span, child of the
span that published the job; a retry is another span of the same trace; a
job enqueued from SQL starts a trace of its own; handlers (async and sync)
see their job, and its trace id, in ``jobq.job_context()``."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from jobq.settings import Settings
from tests.integration.test_consumer import World, _app_db, scenario  # noqa: F401 (fixture)

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the jobq[otel] test extra")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

EXPORTER = InMemorySpanExporter()


@pytest.fixture(autouse=True)
def _provider() -> None:
    """One SDK provider per process (OpenTelemetry allows setting it once)."""
    if not isinstance(trace.get_tracer_provider(), sdk.TracerProvider):
        provider = sdk.TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    EXPORTER.clear()


def _finished(job_id: uuid.UUID) -> list[Any]:
    return sorted((s for s in EXPORTER.get_finished_spans()
                   if s.name == "jobq.run" and (s.attributes or {}).get("jobq.job_id")
                   == str(job_id)),
                  key=lambda s: int((s.attributes or {}).get("jobq.attempt", 0)))


async def _runs(job_id: uuid.UUID, n: int = 1) -> list[Any]:
    """The job's n run spans: a span ends just after its completion commits,
    so the row can say completed a moment before the last span is exported."""
    for _ in range(200):
        if len(spans := _finished(job_id)) >= n:
            return spans
        await asyncio.sleep(0.01)
    return _finished(job_id)


def test_runs_are_children_of_the_publishing_span_and_retries_share_its_trace(
        settings: Settings) -> None:
    async def body(w: World) -> None:
        with trace.get_tracer("test").start_as_current_span("POST /signup") as request:
            (jid,) = await w.publish("work", {"fail_times": 1})
        await w.wait_status(jid, "completed")
        runs = await _runs(jid, 2)
        ctx = request.get_span_context()
        assert [s.attributes["jobq.attempt"] for s in runs] == [1, 2]
        assert [s.attributes["jobq.outcome"] for s in runs] == ["error", "ok"]
        for span in runs:
            assert span.context.trace_id == ctx.trace_id
            assert span.parent is not None and span.parent.span_id == ctx.span_id
            assert span.kind is trace.SpanKind.CONSUMER
            assert span.attributes["jobq.queue"] == "work"
            assert span.attributes["jobq.worker"] == w.consumer.worker_id
        assert runs[0].context.span_id != runs[1].context.span_id

    scenario(settings, body)


def test_a_workflows_steps_and_dependants_are_children_of_the_publishing_span(
        settings: Settings) -> None:
    """Found by hand: a job published with after= (or as a workflow's step)
    went through jobq.enqueue, which stored no trace context, so its run
    started a trace of its own though it was published inside a span."""
    from jobq.client.workflow import Workflow
    from jobq.newjob import NewJob

    async def body(w: World) -> None:
        with trace.get_tracer("test").start_as_current_span("POST /order") as request:
            (first,) = await w.publish("work", {})
            (then,) = await w.client.publish_many([NewJob("work", {}, after=[first])])
            wf = Workflow()
            step = wf.step("work", {})
            await w.client.publish_workflow(wf)
        ctx = request.get_span_context()
        for jid in (then, step.id):
            await w.wait_status(jid, "completed")
            (run,) = await _runs(jid)
            assert run.context.trace_id == ctx.trace_id
            assert run.parent is not None and run.parent.span_id == ctx.span_id

    scenario(settings, body)


def test_a_job_enqueued_from_sql_starts_a_trace_of_its_own(settings: Settings) -> None:
    async def body(w: World) -> None:
        with trace.get_tracer("test").start_as_current_span("unrelated") as other:
            jid = await w.pool.fetchval("SELECT jobq.enqueue('work', '{}'::jsonb)")
        await w.wait_status(jid, "completed")
        (run,) = await _runs(jid)
        assert run.parent is None
        assert run.context.trace_id != other.get_span_context().trace_id
        assert await w.pool.fetchval("SELECT count(*) FROM jobq.job_trace") == 0

    scenario(settings, body)


def test_handlers_see_their_job_and_trace_in_job_context(settings: Settings) -> None:
    async def body(w: World) -> None:
        with trace.get_tracer("test").start_as_current_span("publish"):
            ids = await w.publish("context", None)
            ids += await w.publish("context_sync", None)
        for jid, queue in zip(ids, ("context", "context_sync")):
            row = await w.wait_status(jid, "completed")
            (run,) = await _runs(jid)
            got = json.loads(row["result"])
            assert got == {"job": str(jid), "queue": queue, "attempt": 1,
                           "worker": w.consumer.worker_id,
                           "trace_id": format(run.context.trace_id, "032x")}

    scenario(settings, body, queues=["context", "context_sync", "work"])


def test_the_least_privileged_producer_publishes_workflows_and_traced_jobs(
        settings: Settings, db_url: str, logins: Any) -> None:
    """Issue #47 M8: the documented producer login could not publish a
    workflow, an after= job or anything inside a traced span ("permission
    denied for table job_trace"): the carrier is now written by the enqueue
    functions themselves."""
    import asyncpg

    from jobq import Client, NewJob, Workflow

    producer = settings.model_copy(update={"database_url": logins.url("producer", db_url)})

    async def go() -> list[Any]:
        async with Client(producer) as client:
            with trace.get_tracer("test").start_as_current_span("POST /orders"):
                plain = await client.publish("work", {})
                batch = await client.publish_many([NewJob("work", {}), NewJob("work", {})])
                after = await client.publish("work", {}, after=[plain])
                wf = Workflow()
                first = wf.step("work", {})
                wf.step("work", {}, after=[first])
                workflow = await client.publish_workflow(wf)
        conn = await asyncpg.connect(db_url)
        try:
            return list(await conn.fetch(
                "SELECT j.id, t.carrier IS NOT NULL AS traced FROM jobq.job j "
                "LEFT JOIN jobq.job_trace t ON t.job_id = j.id "
                "WHERE j.id = ANY($1) OR j.workflow_id = $2",
                [plain, *batch, after], workflow))
        finally:
            await conn.close()

    rows = asyncio.run(go())
    assert len(rows) == 6 and all(r["traced"] for r in rows)
