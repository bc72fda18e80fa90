"""The reapers' dependants duty: settle what waits for other jobs.

A job published ``after`` others holds an edge per parent
(``jobq.job_dependency``). The producer that wrote it read its parents
without locking them (I11: a producer's open transaction must never hold a
row a worker renews or completes), and a parent's end only sends a NOTIFY.
Everything else is here, in ``jobq.settle_dependants`` (schema 0024): arm a
new edge whose parent still runs (the parent's end will wake us), release a
dependant once its last parent completed, cancel it, with the reason, when
one failed or was cancelled; iteratively, a bounded batch a call, one reaper
at a time. So cancelling the head of a 1,000-long chain, or completing a job
with 50,000 dependants, costs one sweep's budget at a time and never holds
a worker's completion or another queue's recovery.
"""

from __future__ import annotations

import logging

from jobq.reaper.store import ReaperStore
from jobq.rows import Settled
from jobq.telemetry import metrics

log = logging.getLogger("jobq.reaper")


async def settle(store: ReaperStore, budget: int, rounds: int) -> Settled:
    """Settle at most ``budget`` edges in ``rounds`` rounds (one level of a
    chain a round), in one short transaction."""
    done = await store.settle(budget, rounds)
    if done.released or done.cancelled:
        metrics.SWEEP_ROWS.labels("released").inc(done.released)
        metrics.SWEEP_ROWS.labels("cancelled").inc(done.cancelled)
        log.info("dependants: %d released, %d cancelled%s", done.released, done.cancelled,
                 " (more to settle)" if done.more else "")
    return done
