"""What a running job that waits or streams needs of the database (issue
#52): the index of its recorded steps, the signal it waits for, the child it
spawns once per name, the children it joins, the chunks it emits. Each
statement is fenced by the job's lease token, as every worker write is: a
zombie run reads and makes nothing. The suspend itself is the worker
store's (worker/store.py), as every end of a run is."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobq.db import Database, fetch, fetchrow
from jobq.sql import Q


@dataclass(frozen=True, slots=True)
class Child:
    """A joined child as it is now (join_results)."""

    id: uuid.UUID
    status: str
    result: str | None
    last_error: str | None
    spawned: bool  # by the joining job (job.join takes only its own children)


async def step_names(pool: Database, job_id: uuid.UUID, lock: uuid.UUID) -> dict[str, str]:
    """Name -> function of every step this job recorded (not the results):
    a run's index of its record (worker/steps.py). Only with the live lease."""
    return {r["name"]: r["fn"] for r in await fetch(pool, Q["step_names"], job_id, lock)}


async def signal_get(pool: Database, job_id: uuid.UUID, lock: uuid.UUID,
                     name: str) -> tuple[str] | None:
    """(payload as JSON text,) of signal ``name`` sent to this job, if one
    was; marked delivered. Only for the holder of the live lease."""
    rows = await fetch(pool, Q["signal_get"], job_id, lock, name)
    return (rows[0]["payload"],) if rows else None


async def spawn(pool: Database, job_id: uuid.UUID, lock: uuid.UUID, name: str, queue: str,
                payload: Any, delay_s: float, priority: int, key: str | None) -> uuid.UUID | None:
    """The child named ``name`` of this job, made once (None: lease lost)."""
    rows = await fetch(pool, Q["spawn"], job_id, lock, name, queue, json.dumps(payload),
                       delay_s, priority, key)
    return rows[0]["id"] if rows else None


async def children(pool: Database, job_id: uuid.UUID, lock: uuid.UUID,
                   ids: Sequence[uuid.UUID]) -> list[Child] | None:
    """The children as they are now, for the holder of the live lease
    (None: the lease is lost)."""
    rows = await fetch(pool, Q["join_results"], job_id, lock, list(ids))
    if not rows or not rows[0]["held"]:
        return None
    return [Child(r["id"], r["status"], r["result"], r["last_error"], r["spawned"])
            for r in rows if r["id"] is not None]


async def output_emit(pool: Database, job_id: uuid.UUID, lock: uuid.UUID, text: str,
                      cap: int) -> Any:
    """The chunk stored as the job's next (ours, n, before: queries.sql)."""
    return await fetchrow(pool, Q["output_emit"], job_id, lock, text, cap)
