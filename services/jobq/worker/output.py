"""``await job.emit(chunk)``: a running handler's streamed output (issue #52,
item 5; schema 0033).

Each chunk (JSON, at most the queue's ``max_payload_bytes``) is a row of
``jobq.job_output`` numbered 1, 2, ... across all runs of the job, written
by the holder of the job's live lease only, and committed before ``emit``
returns its offset: a reader (``client.stream``) never sees a chunk that is
not durable. One emit of a job at a time (a lock per run), so numbers never
collide. A job holds at most MAX_CHUNKS; past it, or too large, the emit is
refused with :class:`jobq.errors.BadInput`; a lost lease raises LeaseLost,
as every worker write does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jobq.errors import MAX_CHUNKS, BadInput, LeaseLost
from jobq.worker.waits_store import output_emit


def encode(chunk: Any) -> str:
    try:
        return json.dumps(chunk, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise BadInput(f"job.emit takes JSON (a str, number, list or dict): {exc}") from None


async def emit(link: Any, chunk: Any, lock: asyncio.Lock) -> int:
    """``link``: the run's worker.steps.JobLink (pool, job id, lease token)."""
    text = encode(chunk)
    async with lock:
        row = await output_emit(link.pool, link.job_id, link.lock, text, MAX_CHUNKS)
    assert row is not None  # one row, always
    if not row["ours"]:
        raise LeaseLost(f"job {link.job_id}: lease lost before its output was stored")
    if row["n"] is None:
        if row["before"] >= MAX_CHUNKS:
            raise BadInput(f"job {link.job_id} emitted {MAX_CHUNKS} chunks, the most a job "
                           "keeps; emit fewer, larger chunks")
        raise BadInput(f"a chunk of {len(text)} bytes is over its queue's max_payload_bytes")
    n: int = row["n"]
    return n
