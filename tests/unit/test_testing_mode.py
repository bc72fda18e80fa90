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


def test_the_fixture_gives_a_client(jobq_client: InMemoryClient) -> None:
    assert jobq_client.jobs() == []
