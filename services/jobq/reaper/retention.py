"""The reapers' retention duty: delete finished jobs past their queue's
``keep_*_s`` (with their history), a batch at a time, and the per-key rate
buckets that sat idle (a full bucket is the same as none)."""

from __future__ import annotations

import logging

from jobq.reaper.store import ReaperStore
from jobq.telemetry import metrics

log = logging.getLogger("jobq.reaper")


async def prune_expired(store: ReaperStore, batch: int, max_batches: int) -> int:
    """Delete up to ``max_batches`` batches of expired jobs; returns how many."""
    total = 0
    for _ in range(max_batches):
        n = await store.prune_finished(batch)
        total += n
        if n < batch:
            break
    await store.prune_keys()
    if total:
        metrics.SWEEP_ROWS.labels("pruned").inc(total)
        log.info("pruned %d finished job(s) past their queue's retention", total)
    return total
