"""Fleet-wide limits per queue (issue #17): ``max_running`` (at most N jobs
of the queue active at once, across every consumer) and ``rate_per_s`` (at
most N starts per second, a token bucket of one second's worth).

Both are decided where the claim is, in the claim statement itself, under a
lock on the queue's row (queries.sql, ``claim``), so they hold whatever the
number of consumers and their concurrency. A delivery the limit refuses is
acked and its row *parked* (unpublished, ``relay_after = 'infinity'``): no
message circles while the queue is full. Every reaper sweep releases as
many parked rows, oldest first, as the limit would let start now; the relay
publishes them in the same sweep. Queues without a limit pay one index probe
of ``jobq.queue`` per claim and nothing else.
"""

from __future__ import annotations

from typing import Any

from jobq.db import execute
from jobq.sql import Q


async def unpark(pool: Any) -> int:
    """Reaper: hand parked jobs back to the relay as slots free; how many."""
    status = await execute(pool, Q["unpark"])
    return int(status.split()[-1])
