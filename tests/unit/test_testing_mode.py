"""jobq.testing (issue #32): handlers run in memory as a consumer would run
them, with no service: payload models, sync handlers, progress, steps that
run once per job across re-runs, parents, Retry/Fail as exceptions; an
in-memory client records publishes and runs them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import jobq
from jobq import testing
from jobq.errors import BadInput, Fail, InvalidPayload, Retry
from jobq.testing import InMemoryClient, MemoryJob, run_job

jobq_client = testing.jobq_client  # the fixture, as a conftest would import it

app = jobq.App()
charges: list[int] = []


class Email(BaseModel):
    to: str


def charge(amount: int) -> dict[str, int]:
    charges.append(amount)
    return {"charged": amount}


@app.handler("emails", payload=Email)
async def send(job: jobq.Job) -> dict[str, Any]:
    assert isinstance(job.payload, Email)
    await job.progress(50)
    return {"sent": job.payload.to}


@app.handler("pay")
async def pay(job: jobq.Job) -> Any:
    receipt = await job.step("charge", charge, job.payload["amount"])
    if job.attempt == 1:
        raise Retry("the bank said later", delay_s=5)
    return receipt


@app.handler("sync")
def sync_handler(job: jobq.Job) -> int:
    if job.payload.get("fail"):
        raise Fail("never")
    return int(job.payload["n"]) * 2


@app.handler("after")
async def after(job: jobq.Job) -> int:
    return len(await job.parents())


def test_a_handler_runs_with_its_model_and_progress() -> None:
    tj = MemoryJob("emails", {"to": "a@b.c"})
    assert asyncio.run(run_job(app, tj)) == {"sent": "a@b.c"}
    assert tj.progress == [50]
    with pytest.raises(Exception, match="validation error"):
        asyncio.run(run_job(app, "emails", {"nope": 1}))


def test_steps_run_once_per_job_and_retries_raise() -> None:
    charges.clear()
    tj = MemoryJob("pay", {"amount": 7})
    with pytest.raises(Retry):
        asyncio.run(run_job(app, tj))
    assert asyncio.run(run_job(app, tj)) == {"charged": 7}  # the re-run
    assert charges == [7] and tj.steps == {"charge": {"charged": 7}}


def test_sync_handlers_fail_and_bad_input() -> None:
    assert asyncio.run(run_job(app, "sync", {"n": 21})) == 42
    with pytest.raises(Fail):
        asyncio.run(run_job(app, "sync", {"fail": True}))
    with pytest.raises(BadInput, match="no handler"):
        asyncio.run(run_job(app, "missing", {}))


def test_the_in_memory_client_records_and_runs_what_was_published() -> None:
    client = InMemoryClient()

    async def code_under_test() -> None:
        a = await client.publish("sync", {"n": 1})
        await client.publish_many([jobq.NewJob("sync", {"n": 2}),
                                   jobq.NewJob("after", {}, after=(a,))])

    asyncio.run(code_under_test())
    client.publish_sync("elsewhere", {})
    assert [j.queue for j in client.jobs()] == ["sync", "sync", "after", "elsewhere"]
    results = asyncio.run(client.run_all(app))
    assert sorted(v for v in results.values()) == [1, 2, 4]
    with pytest.raises(InvalidPayload):
        client.publish_sync("q", {"x": float("nan")})


@app.handler("fan")
async def fan(job: jobq.Job) -> int:
    """Publishes follow-up jobs, as a handler of a pipeline does."""
    for n in range(int(job.payload["n"])):
        await FAN_CLIENT.publish("sync", {"n": n})
    return int(job.payload["n"])


FAN_CLIENT = InMemoryClient()


def test_a_workflow_and_what_handlers_publish_run_in_memory() -> None:
    """Found by hand: the in-memory client had no publish_workflow (a
    workflow's code could not be tested without services), and run_all ran
    only what was published before it was called, each time it was called."""
    client = FAN_CLIENT
    wf = jobq.Workflow()
    first = wf.step("sync", {"n": 5})
    second = wf.step("sync", {"n": 6})
    wf.step("after", {}, after=[first, second])
    wid = asyncio.run(client.publish_workflow(wf))
    assert wid == wf.id and len({first.id, second.id}) == 2
    assert client.jobs("after")[0].after == (first.id, second.id)
    results = asyncio.run(client.run_all(app))
    assert [results[first.id], results[second.id]] == [10, 12]
    assert list(results.values())[-1] == 2  # the step saw both parents' results
    asyncio.run(client.enqueue(None, "fan", {"n": 3}))  # as in the caller's transaction
    again = asyncio.run(client.run_all(app))  # only what had not run, and what it published
    assert sorted(again.values()) == [0, 2, 3, 4]
    assert asyncio.run(client.run_all(app)) == {}
    sync_wf = jobq.Workflow()  # as SyncClient.publish_workflow, from sync code
    sync_wf.step("sync", {"n": 1})
    assert client.publish_workflow_sync(sync_wf) == sync_wf.id
    assert asyncio.run(client.run_all(app)) == {sync_wf.steps[0].id: 2}


@app.handler("forever")
async def forever(job: jobq.Job) -> None:
    await FOREVER_CLIENT.publish("forever", {})


FOREVER_CLIENT = InMemoryClient()


def test_run_all_says_so_when_handlers_keep_publishing(monkeypatch: Any) -> None:
    import jobq.testing

    monkeypatch.setattr(jobq.testing, "RUN_ALL_MAX", 50)
    asyncio.run(FOREVER_CLIENT.publish("forever", {}))
    with pytest.raises(BadInput, match=r"more keep coming.*\(forever\)"):
        asyncio.run(FOREVER_CLIENT.run_all(app))


def test_the_fixture_gives_a_client(jobq_client: InMemoryClient) -> None:
    assert jobq_client.jobs() == []


def test_run_job_goes_through_the_apps_middleware_and_end_hooks() -> None:
    """Issue #50.2: jobq.testing ran the bare handler, so a handler that needs
    its middleware's context (a DB session, a tenant) could not be tested."""
    import contextvars
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant")
    app = jobq.App()
    ends: list[tuple[str, str | None]] = []

    @app.around
    async def with_tenant(job: jobq.Job, call_next: Any) -> Any:
        token = tenant.set(f"t-{job.payload['n']}")
        try:
            return await call_next()
        finally:
            tenant.reset(token)

    @app.on_end
    def report(end: jobq.RunEnd) -> None:
        ends.append((end.outcome, type(end.error).__name__ if end.error else None))

    @app.handler("sync_t")
    def work(job: jobq.Job) -> str:
        if job.payload["n"] == 2:
            raise KeyError("x")
        return tenant.get()

    assert asyncio.run(run_job(app, "sync_t", {"n": 1})) == "t-1"  # seen in the thread too
    with pytest.raises(KeyError):
        asyncio.run(run_job(app, "sync_t", {"n": 2}))
    assert ends == [("ok", None), ("error", "KeyError")]
