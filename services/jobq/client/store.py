"""What a client needs of the database, typed (the client's side of the
stores: ``worker/store.py`` is the worker's, ``reaper/store.py`` the
reapers'): enqueue a batch or one linked job, which new jobs a cap parked,
the queues' payload limits, publish marks, a job watched for its end, a
signal sent to a job.

Plain functions on a pool or a connection (a client's enqueue can run in
its caller's transaction), each on one statement of queries.sql.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from jobq.db import Database, execute, fetch, fetchrow, fetchval, warnings_logged
from jobq.db_errors import pg_message
from jobq.errors import BadInput, UnknownJob
from jobq.newjob import COLUMNS, NewJob, arrays
from jobq.sql import Q


@dataclass(frozen=True)
class Row:
    """A job to insert: its options, its checked payload text, and the
    publisher's trace context (telemetry/tracing.py) or None."""

    job: NewJob
    text: str
    trace: str | None = None


@dataclass(frozen=True, slots=True)
class JobState:
    """Where a watched job is (watch): its status, result and error."""

    id: uuid.UUID
    status: str
    result: str | None
    last_error: str | None
    last_traceback: str | None = None


async def insert(db: Database, rows: Sequence[Row], grace_s: float) -> list[uuid.UUID]:
    """Insert a batch (jobq.enqueue_many, one array per option, newjob.COLUMNS),
    storing the trace contexts beside the rows that have one; their ids in
    input order. ``grace_s``: how long the relay leaves them to the caller
    to publish (0: the relay's at once, the reapers woken at commit)."""
    args = (*arrays([r.job for r in rows], [r.text for r in rows]), grace_s)
    traces = [r.trace for r in rows]
    keyed = any(r.job.idempotency_key for r in rows)  # a reused key is warned of (0039)
    async with warnings_logged(db) if keyed else contextlib.nullcontext(db) as db:
        if any(t is not None for t in traces):
            got = await fetch(db, Q["enqueue_many_traced"], *args, traces)
        else:
            got = await fetch(db, Q["enqueue_many"], *args)
    return [r["id"] for r in got]


async def insert_linked(db: Database, job: NewJob, text: str, after: Sequence[uuid.UUID],
                        grace_s: float, trace: str | None) -> uuid.UUID:
    """One job through jobq.enqueue with every option (it may wait for
    ``after``, or belong to a workflow), in the caller's transaction."""
    async with warnings_logged(db) if job.idempotency_key else contextlib.nullcontext(db) as db:
        job_id: uuid.UUID = await fetchval(
            db, Q["enqueue_linked"], *(get(job, text) for _, get in COLUMNS), grace_s,
            list(after) or None, job.workflow_id, trace, job.expires_in_s,
            job.idempotency_window_s, job.idempotency_while_live, job.on_duplicate)
    return job_id


async def held_back(db: Database, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of this login's new jobs a per-key cap parked at insert."""
    return {r["id"] for r in await fetch(db, Q["held_back"], list(ids))}


async def payload_limits(db: Database, queues: Sequence[str]) -> dict[str, int]:
    """max_payload_bytes of the queues that exist."""
    rows = await fetch(db, Q["queue_limits"], list(queues))
    return {r["name"]: int(r["max_payload_bytes"]) for r in rows}


async def mark(db: Database, rows: Sequence[tuple[uuid.UUID, uuid.UUID | None]],
               own_spells: bool = False) -> None:
    """Mark confirmed ids published (id, the spell's token; None: a new row)."""
    await execute(db, Q["mark_republished" if own_spells else "mark_published"],
                  [i for i, _ in rows], [lk for _, lk in rows])


async def signal(db: Database, job_id: uuid.UUID, name: str, payload_json: str) -> bool:
    """Send signal ``name`` to a job (jobq.signal, schema 0028): True if
    kept, False if one of that name was sent before (the first is kept).
    A job unknown (UnknownJob) or ended (BadInput): nothing stored."""
    try:
        return bool(await fetchval(db, Q["signal"], job_id, name, payload_json))
    except asyncpg.exceptions.NoDataFoundError as exc:
        raise UnknownJob(pg_message(exc)) from None
    except (asyncpg.exceptions.ObjectNotInPrerequisiteStateError,
            asyncpg.exceptions.InvalidParameterValueError,
            asyncpg.exceptions.StringDataRightTruncationError) as exc:
        raise BadInput(pg_message(exc)) from None


async def watch(db: Database, job_id: uuid.UUID) -> JobState | None:
    """Watch the job (its end sends a NOTIFY) and read where it is; None if
    there is no such job."""
    row: Any = await fetchrow(db, Q["watch"], job_id)
    if row is None:
        return None
    return JobState(row["id"], row["status"], row["result"], row["last_error"],
                    row["last_traceback"])


async def output_read(db: Database, job_id: uuid.UUID, after: int, limit: int) -> Any:
    """The job's status and up to ``limit`` chunks after offset ``after`` as
    JSON text (client.stream); None: no such job."""
    return await fetchrow(db, Q["output_read"], job_id, after, limit)
