"""The live invariant monitor: every reaper reads the history jobq already
keeps and records each job that broke one of its promises (schema 0035).

What is checked (queries.sql, ``audit_*``): no job claimed by a worker while
another worker's claim had not ended (two live leases, I2); no completion by
a worker that did not hold the job's latest claim, or after that claim ended
(a completion accepted without a live lease); no lease lapsed longer ago
than the grace and still active (I3); no ready job left unpublished by the
relay past the grace (I1). The first two read only what is new since the
last check (a watermark per reaper: the job_event number, the completion's
finish time), so a check costs what happened since, not the table.

A violation is a row of ``jobq.invariant_violation``, once per job and kind
(reapers are peers: the one whose insert made the row counts it), counted by
``jobq_invariant_violations_total{kind}``. jobq itself should never make
one; a row means a bug, a forged row, or a clock or history that cannot be
trusted (a queue's history switched off and on mid-run). ``jobq audit``
runs the same checks over the whole history and prints what they found.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from jobq.reaper.store import PgAuditStore
from jobq.telemetry import metrics
from jobq.telemetry.logs import fields

log = logging.getLogger("jobq.audit")

BATCH = 5000  # events or completions one statement reads
KINDS = ("two_live_leases", "completed_without_lease", "overdue_lease", "unpublished")
NEVER = datetime.min.replace(tzinfo=UTC)
NIL = uuid.UUID(int=0)


@dataclass
class Audit:
    """Watermarks of one auditor; ``found`` counts new violations by kind."""

    grace_s: float
    after_n: int = 0
    after_at: datetime = NEVER
    after_id: uuid.UUID = NIL
    found: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    async def check(self, store: PgAuditStore, *, until_done: bool = False,
                    quiet: bool = False) -> dict[str, int]:
        """One round of every check (all batches with ``until_done``); the new
        violations by kind, also added to the metric and logged (unless
        ``quiet``: jobq audit prints them itself)."""
        new = dict.fromkeys(KINDS, 0)
        while True:
            last, found = await store.claims(self.after_n, BATCH)
            moved, self.after_n = last != self.after_n, last
            new["two_live_leases"] += found
            if not (until_done and moved):
                break
        while True:
            mark, found = await store.completions((self.after_at, self.after_id), BATCH)
            moved = mark != (self.after_at, self.after_id)
            self.after_at, self.after_id = mark
            new["completed_without_lease"] += found
            if not (until_done and moved):
                break
        for kind, n in (await store.now(self.grace_s)).items():
            new[kind] += n
        for kind, n in new.items():
            if n:
                self.found[kind] += n
                metrics.INVARIANT_VIOLATIONS.labels(kind).inc(n)
                if not quiet:
                    log.error("invariant violated: %d new %s (jobq audit prints them)", n,
                              kind, extra=fields(event="invariant_violation", kind=kind))
        return new
