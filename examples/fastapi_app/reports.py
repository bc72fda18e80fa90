"""The jobs of the example: consumers run ``jobq consume reports:app``."""

import jobq
from pydantic import BaseModel

app = jobq.App()


class Report(BaseModel):
    customer: str
    month: str


@app.task("reports", payload=Report)
async def build_report(job: jobq.Job[Report]) -> dict[str, str]:
    await job.emit({"step": "query", "customer": job.payload.customer})  # to /events
    await job.emit({"step": "render", "month": job.payload.month})
    return {"customer": job.payload.customer, "url": f"/files/{job.payload.month}.pdf"}
