"""A FastAPI service that publishes jobs and waits for results: one
jobq.Client for the process, opened and closed by the lifespan, used by
the typed task handles. Run: ``uvicorn main:api``."""

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import jobq
from fastapi import FastAPI, HTTPException

from reports import Report, app, build_report


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    async with jobq.Client() as client:  # settings from JOBQ_* variables
        app.use(client)  # build_report.publish(...) publishes with it
        api.state.jobq = client
        yield


api = FastAPI(lifespan=lifespan)


@api.post("/reports", status_code=202)
async def request_report(report: Report) -> dict[str, str]:
    job_id = await build_report.publish(report, key=report.customer)  # fair per customer
    return {"job": str(job_id)}


@api.get("/reports/{job_id}")
async def report_result(job_id: uuid.UUID, wait: float = 10.0) -> dict[str, str]:
    client: jobq.Client = api.state.jobq
    try:
        result: dict[str, str] = await client.result(job_id, timeout=wait)
        return result
    except TimeoutError:
        raise HTTPException(202, "not done yet") from None
    except jobq.JobFailed as exc:
        raise HTTPException(500, str(exc)) from None
