"""The benchmark's handler: does nothing, so the figures are jobq's own cost."""

from jobq import App, Job

app = App()


@app.handler("noop")
async def noop(job: Job) -> None:
    return None
