"""A FastAPI service that publishes jobs, waits for results and streams
what a job emits: one jobq.Client for the process, opened and closed by the
lifespan, used by the typed task handles. Run: ``uvicorn main:api``."""

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import jobq
from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import StreamingResponse

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
    except jobq.UnknownJob:
        raise HTTPException(404, f"no job {job_id}") from None


@api.get("/reports/{job_id}/events")
async def report_events(job_id: uuid.UUID,
                        last_event_id: str | None = Header(None)) -> StreamingResponse:
    """What the job emits, as Server-Sent Events; a browser's EventSource
    resumes after a disconnect from the Last-Event-ID it sends."""
    client: jobq.Client = api.state.jobq
    start = int(last_event_id) if last_event_id and last_event_id.isdigit() else 0

    async def events() -> AsyncIterator[str]:
        async for item in client.stream(job_id, from_offset=start):
            if isinstance(item, jobq.RunBoundary):  # a re-run after a crash starts
                yield f"event: rerun\ndata: {item.attempt}\n\n"
            else:
                yield f"id: {item.offset}\ndata: {json.dumps(item.data)}\n\n"
        yield "event: end\ndata: {}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
