"""mypy --strict must accept this file (tests/unit/test_typing.py)."""

from __future__ import annotations

import uuid

from pydantic import BaseModel

import jobq

app = jobq.App()


class Email(BaseModel):
    to: str


@app.task("emails", payload=Email)
async def send_email(job: jobq.Job[Email]) -> None:
    print(job.payload.to.upper())  # the payload is an Email here


@app.task("anything")
async def anything(job: jobq.Job) -> None:
    print(job.payload)


async def caller(client: jobq.Client) -> uuid.UUID:
    await send_email.publish(Email(to="a@example.com"), priority=5, key="tenant-1")
    await anything.publish({"free": ["json"]})
    new: jobq.NewJob = send_email.job(Email(to="b@example.com"), delay_s=10)
    await client.publish_many([new])
    return await send_email.publish(Email(to="c@example.com"), client=client)


def sync_caller() -> uuid.UUID:
    return send_email.publish_sync(Email(to="a@example.com"), idempotency_key="welcome-a")
