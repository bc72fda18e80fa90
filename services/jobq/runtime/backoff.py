"""The one retry schedule every jobq loop uses: exponential delays, capped.

Loops that retry differ in *what* they retry and *when they give up* — the
start-up waits (forever, for what can heal), the registry session (for the
process's life), claims (a few tries, then the messages go back), final
writes (while the lease is trusted), child respawns, reaper sweeps — and say
so where they are. How long they wait between tries is this, in one place.
"""

from __future__ import annotations

import asyncio


class Backoff:
    def __init__(self, first_s: float, cap_s: float, factor: float = 2.0) -> None:
        self.first_s = first_s
        self.cap_s = cap_s
        self.factor = factor
        self._next = first_s

    def next(self) -> float:
        """The delay before the next try (and grow the one after)."""
        delay = self._next
        self._next = min(delay * self.factor, self.cap_s)
        return delay

    def reset(self) -> None:
        """After a success: the next failure starts from the first delay."""
        self._next = self.first_s

    async def sleep(self) -> float:
        delay = self.next()
        await asyncio.sleep(delay)
        return delay
