"""jobq.testing runs handlers that sleep and wait for signals in memory
(issue #52): a sleep returns at once and is listed, a wait without its
signal suspends, and the same MemoryJob run again after ``signal`` goes on
with its steps from the first run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import jobq
from jobq.errors import Suspended
from jobq.testing import MemoryJob, run_job

app = jobq.App()
calls: list[str] = []


def _open() -> str:
    calls.append("open")
    return "T-1"


@app.handler("refunds")
async def refund(job: jobq.Job) -> Any:
    ticket = await job.step("open", _open)
    await job.sleep("cool-down", 30)
    answer = await job.wait_for("approval", timeout_s=60)
    return {"ticket": ticket, "answer": answer}


def test_a_waiting_handler_runs_in_memory_until_signalled() -> None:
    job = MemoryJob("refunds", {})
    with pytest.raises(Suspended):
        asyncio.run(run_job(app, job))
    assert job.slept == ["cool-down"] and job.signal("approval", {"ok": True})
    assert not job.signal("approval", {"ok": False})  # the first is kept
    assert asyncio.run(run_job(app, job)) == {"ticket": "T-1", "answer": {"ok": True}}
    assert calls == ["open"]  # the step ran once across both runs


@app.handler("fanout")
async def fanout(job: jobq.Job) -> Any:
    kids = [await job.spawn(f"c{i}", "work", {"n": i}) for i in range(2)]
    return await job.join(kids)


def test_spawned_children_are_joined_in_memory_once_given_their_results() -> None:
    job = MemoryJob("fanout", {})
    with pytest.raises(Suspended):
        asyncio.run(run_job(app, job))
    ids = [child for _, _, child in job.spawned.values()]
    job.results.update({ids[0]: "a", ids[1]: "b"})
    assert asyncio.run(run_job(app, job)) == ["a", "b"]
    assert [child for _, _, child in job.spawned.values()] == ids  # once per name
