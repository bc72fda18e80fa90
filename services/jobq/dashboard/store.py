"""What the dashboard reads, one method a statement (``queries.sql``'s
``dash_*`` and the inspect statements the CLI shares).

Every page reads through :class:`Reads` on the reader pool (a login with
only ``jobq_reader``'s rights when one is given); the two actions go through
``ops/admin.py`` on the operator's pool. Rows come back as the driver's
records: the templates read them by column name.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from jobq import roles
from jobq.db import fetch, fetchval
from jobq.sql import Q


class Reads:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def queues(self) -> list[Any]:
        return await fetch(self.pool, Q["dash_queues"])

    async def throughput(self) -> list[Any]:
        """Jobs done per queue and minute, the last hour (the sparklines)."""
        return await fetch(self.pool, Q["dash_throughput"])

    async def running(self, limit: int) -> list[Any]:
        return await fetch(self.pool, Q["dash_running"], limit)

    async def stalled(self, limit: int) -> list[Any]:
        return await fetch(self.pool, Q["dash_stalled"], limit)

    async def failed(self, limit: int) -> list[Any]:
        return await fetch(self.pool, Q["dash_failed"], limit)

    async def job(self, job_id: uuid.UUID) -> Any | None:
        rows = await fetch(self.pool, Q["dash_job"], job_id)
        return rows[0] if rows else None

    async def output(self, job_id: uuid.UUID, limit: int) -> list[Any]:
        return await fetch(self.pool, Q["dash_output"], job_id, limit)

    async def history(self, job_id: uuid.UUID) -> list[Any]:
        return await fetch(self.pool, Q["history"], job_id)

    async def links(self, job_id: uuid.UUID) -> list[Any]:
        return await fetch(self.pool, Q["job_links"], job_id)

    async def steps(self, job_id: uuid.UUID) -> list[Any]:
        return await fetch(self.pool, Q["job_steps"], job_id)

    async def workflow(self, workflow_id: uuid.UUID | str) -> list[Any]:
        return await fetch(self.pool, Q["workflow_jobs"], workflow_id)

    async def jobs(self, queue: str, status: str | None, key: str | None,
                   workflow: uuid.UUID | None, before_at: Any, before_id: uuid.UUID | None,
                   limit: int) -> list[Any]:
        """A queue's jobs, newest first, filtered; a page before (at, id)."""
        return await fetch(self.pool, Q["dash_jobs"], queue, status, key, workflow, before_at,
                           before_id, limit)

    async def jobs_in(self, low: uuid.UUID, high: uuid.UUID) -> list[uuid.UUID]:
        """At most two job ids in [low, high] (a short id's range)."""
        return [r["id"] for r in await fetch(self.pool, Q["job_prefix"], low, high)]

    async def workflows_in(self, low: uuid.UUID, high: uuid.UUID) -> list[uuid.UUID]:
        return [r["id"] for r in await fetch(self.pool, Q["workflow_prefix"], low, high)]

    async def workers(self) -> list[Any]:
        return await fetch(self.pool, Q["dash_workers"])

    async def reapers(self) -> list[Any]:
        return await fetch(self.pool, Q["dash_reapers"])


async def is_reader(conn: asyncpg.Connection, prefix: str) -> bool:
    """Whether the login is a member of this install's reader role."""
    return bool(await fetchval(conn, roles.rename(Q["reader_member"], prefix)))
