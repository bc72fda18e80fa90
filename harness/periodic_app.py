"""A test app that declares periodic jobs (harness/apps.py declares none, so
that no other test sees scheduled jobs). Its handler records every run in
test_run, as harness.apps does."""

from __future__ import annotations

from harness.apps import start
from jobq import App, Job

app = App()


@app.periodic(every=1, name="tick")
@app.handler("ticks")
async def ticks(job: Job) -> None:
    await start(job)
