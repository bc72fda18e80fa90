"""The reapers' periodic duty: fire every schedule whose slot has come,
once per slot, whatever the number of reapers (``schedule_fire`` enqueues
only if the slot it read is still the schedule's next one, under the
schedule's row lock). What a schedule is, and how it is declared, is
``schedules.py``; this is only the firing."""

from __future__ import annotations

import logging
from datetime import datetime

from jobq.db import is_transient
from jobq.reaper.store import ReaperStore
from jobq.rows import DueSlot
from jobq.schedules import Schedule
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.schedules")

FIRE_BATCH = 100  # due schedules read per sweep


def _schedule(d: DueSlot) -> Schedule:
    return Schedule(d.name, d.queue, None, d.cron, d.interval_s, d.timezone, d.enabled)


async def fire_due(store: ReaperStore) -> int:
    """Enqueue every due slot (once per slot); returns jobs enqueued. A slot
    that cannot be fired is recorded and stepped over (``_skip``); a lost
    connection is raised (the sweep tries again)."""
    fired = 0
    for d in await store.schedules_due(FIRE_BATCH):
        try:  # catch-up: one run for every slot missed up to now
            job_id, skipped = await store.fire(d, _schedule(d).next_after(d.now, d.next_run_at))
        except Exception as exc:
            if is_transient(exc):
                raise
            await _skip(store, d, exc)
            continue
        if skipped:  # overlap skip: its last job is still queued or running
            log.info("schedule %s: slot %s skipped, its last job is still live", d.name,
                     d.next_run_at.isoformat(), extra=fields(event="schedule_skipped",
                                                             queue=d.queue))
        elif job_id is not None:
            fired += 1
            late = (d.now - d.next_run_at).total_seconds()
            log.info("schedule %s fired", d.name, extra=fields(
                event="scheduled", job=job_id, queue=d.queue, late_s=round(late, 3)))
    return fired


async def _skip(store: ReaperStore, d: DueSlot, exc: BaseException) -> None:
    """Record why the slot was not fired and step over it (disable the
    schedule if no next slot can be computed)."""
    try:
        nxt: datetime | None = _schedule(d).next_after(d.now, d.next_run_at)
    except Exception:
        nxt = None
    why = (str(exc) or type(exc).__name__)[:1000]
    await store.skip(d, nxt, why)
    log.warning("schedule %s: slot %s not fired: %s; %s", d.name, d.next_run_at.isoformat(),
                why, f"next slot {nxt.isoformat()}" if nxt else "schedule disabled",
                extra=fields(event="schedule_failed", queue=d.queue))
