"""mypy --strict must reject every line marked ``# error`` (and no other):
tests/unit/test_typing.py."""

from __future__ import annotations

from pydantic import BaseModel

import jobq

app = jobq.App()


class Email(BaseModel):
    to: str


class Sms(BaseModel):
    number: str


@app.task("emails", payload=Email)
async def send_email(job: jobq.Job[Email]) -> None:
    print(job.payload.number)  # error: an Email has no number


async def caller() -> None:
    await send_email.publish(Sms(number="+1"))  # error: an Sms is not an Email
    await send_email.publish({"to": "a@example.com"})  # error: a dict is not an Email
    await send_email.publish(Email(to="a"), priority="high")  # error: priority is an int
    await send_email.publish(Email(to="a"), queue="other")  # error: the handle names the queue


def sync_caller() -> None:
    send_email.publish_sync(Sms(number="+1"))  # error: an Sms is not an Email
