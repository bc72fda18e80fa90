"""Operator actions behind the CLI's verbs, usable from Python too: set and
list queue settings and key tiers, stats, inspect, audit, retry, cancel,
prune (schedules: ``schedule_admin.py``).

Each takes a pool, runs only named statements from ``queries.sql``, and
returns plain rows or raises a :class:`~jobq.errors.BadInput`; ``cli.py``
parses arguments and prints. Like every writer of job rows, these go through
fenced or status-guarded statements: a retry only moves a failed or
cancelled job, a cancel only a queued or active one.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import asyncpg

from jobq import lease
from jobq.db import execute, fetch, fetchval
from jobq.errors import BadInput, UnknownJob
from jobq.ops.ids import id_range
from jobq.queues import changes, check_queue_name
from jobq.rows import Spell, of
from jobq.sql import Q

log = logging.getLogger("jobq.ops.admin")


async def set_queue(pool: asyncpg.Pool, name: str, values: dict[str, Any]) -> Any:
    """Create the queue if needed and change the given (checked) settings."""
    check_queue_name(name)
    await execute(pool, Q["queue_ensure"], name)
    try:
        (row,) = await fetch(pool, Q["queue_update"], name, changes(values))
    except BadInput as exc:  # schema 0041's CHECK, said in the flags' words
        if getattr(exc.__cause__, "constraint_name", None) != "queue_halt_on_failure_check":
            raise
        raise BadInput("--halt-on-failure on needs --key-policy fifo (it halts a fifo key "
                       "on its failed job); turn it off before another policy") from None
    return row


async def queue_limits(pool: asyncpg.Pool, auto_create: bool | None,
                       max_queues: int | None) -> Any:
    """Show (or change) whether publishing creates queues, and their cap."""
    if auto_create is None and max_queues is None:
        return (await fetch(pool, Q["queue_limits_get"]))[0]
    if max_queues is not None and not 1 <= max_queues <= 100_000:
        raise BadInput(f"--max-queues must be between 1 and 100,000, got {max_queues}")
    return (await fetch(pool, Q["queue_limits_set"], auto_create, max_queues))[0]


async def pause(pool: asyncpg.Pool, name: str, who: str | None = None) -> Any:
    """No job of the queue starts from the next claim on; BadInput if
    unknown. ``who`` is kept with it (the login if None) and logged."""
    who = who or await fetchval(pool, Q["session_login"])
    rows = await fetch(pool, Q["queue_pause"], check_queue_name(name), who)
    if not rows:
        raise BadInput(f"no queue named {name!r} (jobq queue list shows them)")
    log.warning("queue %s paused by %s", name, who)
    return {"queue": name, "paused": True, "by": who}


async def resume(pool: asyncpg.Pool, name: str, who: str | None = None) -> Any:
    """Jobs of the queue start again; its parked jobs are published now."""
    who = who or await fetchval(pool, Q["session_login"])
    rows = await fetch(pool, Q["queue_resume"], check_queue_name(name))
    if not rows:
        raise BadInput(f"no queue named {name!r} (jobq queue list shows them)")
    log.warning("queue %s resumed by %s", name, who)
    return {"queue": name, "paused": False, "released": rows[0]["released"], "by": who}


async def keys(pool: asyncpg.Pool, queue: str | None) -> list[Any]:
    """Per key: queued, running, oldest wait, the limits that apply (jobq.key_stats)."""
    return await fetch(pool, Q["key_stats"], queue)


async def set_key_limit(pool: asyncpg.Pool, queue: str, key: str, max_running: int | None,
                        rate_per_s: float | None) -> Any:
    """A key's tier over its queue's per-key defaults (None: keep, 0: drop)."""
    check_queue_name(queue)
    if not key or len(key) > 1000:
        raise BadInput("a key is 1 to 1000 characters")
    if max_running is not None and not 0 <= max_running <= 1_000_000:
        raise BadInput("--max-running takes 1 to 1000000 (0 drops the key's own cap)")
    if rate_per_s is not None and not (0 <= rate_per_s <= 100_000):  # NaN fails too
        raise BadInput("--rate-per-second takes a number from 0 to 100000 (0 drops it)")
    rows = await fetch(pool, Q["key_limit_set"], queue, key, max_running, rate_per_s)
    if not rows:
        raise BadInput(f"queue {queue} has no per-key limits, so a key's tier would apply to "
                       f"nothing: set a default first (jobq queue set {queue} "
                       "--max-running-per-key N or --rate-per-second-per-key R)")
    return rows[0]


async def list_queues(pool: asyncpg.Pool) -> list[Any]:
    return await fetch(pool, Q["queue_list"])


async def stats(pool: asyncpg.Pool) -> list[Any]:
    return await fetch(pool, Q["stats"])


async def resolve(pool: asyncpg.Pool, text: str) -> uuid.UUID:
    """A job or workflow id from its full text or a short id (8+ leading hex
    digits, as the pages and the CLI print them); BadInput if ambiguous or
    not an id, UnknownJob if nothing has it."""
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    span = id_range(text)
    if span is None:
        raise BadInput(f"{text[:80]!r} is not a job id (a UUID, or at least its first 8 "
                       "hex digits)")
    for statement in ("job_prefix", "workflow_prefix"):
        found = [r["id"] for r in await fetch(pool, Q[statement], *span)]
        if len(found) > 1:
            raise BadInput(f"short id {text!r} is ambiguous ({found[0]}, {found[1]}, ...): "
                           "give more of it")
        if found:
            job_id: uuid.UUID = found[0]
            return job_id
    raise UnknownJob(f"no job or workflow id starts with {text!r}")


async def inspect(pool: asyncpg.Pool, job_id: uuid.UUID) -> tuple[Any, list[Any]]:
    """The job row and its history, oldest first."""
    rows = await fetch(pool, Q["job_get"], job_id)
    if not rows:
        raise UnknownJob(f"no job with id {job_id} (nor a workflow with that id)")
    return rows[0], await fetch(pool, Q["history"], job_id)


async def links_and_steps(pool: asyncpg.Pool, job_id: uuid.UUID) -> tuple[list[Any], list[Any]]:
    """What the job waits for and what waits for it; its durable steps."""
    return await fetch(pool, Q["job_links"], job_id), await fetch(pool, Q["job_steps"], job_id)


async def workflow(pool: asyncpg.Pool, workflow_id: uuid.UUID) -> list[Any]:
    """A workflow's steps in publish order (empty: no such workflow)."""
    return await fetch(pool, Q["workflow_jobs"], workflow_id)


async def _status(pool: asyncpg.Pool, job_id: uuid.UUID) -> str:
    status = await fetchval(pool, Q["job_status"], job_id)
    if status is None:
        raise UnknownJob(f"no job with id {job_id}")
    return str(status)


async def retry(pool: asyncpg.Pool, job_id: uuid.UUID, who: str | None = None) -> Spell:
    """Put a failed or cancelled job back in line; its spell (id, queue,
    lock) to publish. The caller publishes it (the relay does if it does not).
    ``who`` goes into the job's history ("by an operator" if None)."""
    row = await lease.retry_failed(pool, job_id, who)
    if row is None:
        status = await _status(pool, job_id)
        raise BadInput(f"job {job_id} is {status}: only failed or cancelled jobs can be retried")
    if isinstance(row, str):
        raise BadInput(f"job {job_id} not retried: {row}")
    return row


async def cancel(pool: asyncpg.Pool, job_id: uuid.UUID, reason: str | None) -> int:
    """Cancel a job, or every step of a workflow not started yet; how many."""
    if await lease.cancel(pool, job_id, reason):
        return 1
    if await fetchval(pool, Q["job_status"], job_id) is None and await workflow(pool, job_id):
        return int(await fetchval(pool, Q["workflow_cancel"], job_id, reason))  # its id
    raise BadInput(f"job {job_id} is already {await _status(pool, job_id)}")


async def prunable(pool: asyncpg.Pool, older_than_s: float) -> int:
    """How many finished jobs prune would delete now."""
    return int(await fetchval(pool, Q["prune_count"], older_than_s))


async def prune(pool: asyncpg.Pool, older_than_s: float, batch: int) -> int:
    """Delete finished jobs (and their history) older than that, in batches."""
    total = 0
    while True:
        n = int((await execute(pool, Q["prune_batch"], older_than_s, batch)).split()[-1])
        total += n
        if n < batch:
            return total


# ── bulk verbs (jobq cancel --queue, jobq retry --queue, jobq queue delete) ──

BULK_BATCH = 1000  # rows per statement: short locks, as prune


async def counts(pool: asyncpg.Pool, queue: str) -> dict[str, int]:
    """Jobs of the queue per state (states with none are left out)."""
    rows = await fetch(pool, Q["queue_job_counts"], check_queue_name(queue))
    return {r["status"]: int(r["n"]) for r in rows}


async def cancel_queue(pool: asyncpg.Pool, queue: str, statuses: list[str],
                       reason: str | None) -> int:
    """Cancel every job of the queue in those states (queued, active), in
    batches; how many."""
    total = 0
    while True:
        n = int(await fetchval(pool, Q["cancel_queue_batch"], check_queue_name(queue), statuses,
                               BULK_BATCH, reason))
        total += n
        if n < BULK_BATCH:
            return total


async def retry_queue(pool: asyncpg.Pool, queue: str, statuses: list[str]) -> list[Spell]:
    """Put every failed (or cancelled) job of the queue back in line, in
    batches; their spells for the caller to publish."""
    out: list[Spell] = []
    refused: list[uuid.UUID] = []  # wait for a job that failed: left as they are
    while True:
        rows = await fetch(pool, Q["retry_queue_batch"], check_queue_name(queue), statuses,
                           BULK_BATCH, refused)
        refused += [r["id"] for r in rows if r["refused"] is not None]
        out += [of(Spell, r) for r in rows if r["refused"] is None]
        if len(rows) < BULK_BATCH:
            return out


async def delete_queue(pool: asyncpg.Pool, queue: str) -> int:
    """Delete an idle queue with its finished jobs; how many jobs went.
    Refused (BadInput) while jobs of it are queued or active, or a schedule
    fires into it."""
    try:
        (row,) = await fetch(pool, Q["queue_delete"], check_queue_name(queue))
    except asyncpg.ForeignKeyViolationError:
        raise BadInput(f"a job was just published to {queue}; try again, or cancel its jobs "
                       f"first (jobq cancel --queue {queue})") from None
    if row["queue"] is None:
        raise BadInput(f"no queue named {queue!r} (jobq queue list shows them)")
    if row["live"]:
        raise BadInput(f"queue {queue} has {row['live']} queued or running job(s): cancel them "
                       f"first (jobq cancel --queue {queue} --status queued --status active)")
    if row["schedules"]:
        raise BadInput(f"{row['schedules']} schedule(s) enqueue into {queue}: remove them first "
                       "(jobq schedule list)")
    return int(row["jobs"])


async def audit(pool: asyncpg.Pool, grace_s: float, job: uuid.UUID | None
                ) -> tuple[list[Any], list[Any]]:
    """``jobq audit``: the invariant monitor's checks over the whole history
    now (recording what they find), then (``job``'s runs, the violations
    recorded: ``job``'s, or all)."""
    from jobq.reaper.audit import Audit
    from jobq.reaper.store import PgAuditStore

    await Audit(grace_s).check(PgAuditStore(pool), until_done=True, quiet=True)
    runs = await fetch(pool, Q["audit_runs"], job) if job is not None else []
    return runs, await fetch(pool, Q["audit_list"], job)

