"""An open-loop schedule of single publishes (bench/latency.py and the peers'
``paced`` entrypoints): ``callers`` tasks, ``rate`` a second in all, each on a
fixed beat, so a slow publish does not lower the offered load. Plain asyncio:
the peers' own venv imports it too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def paced(rate: float, seconds: float, callers: int,
                send: Callable[[int], Awaitable[object]]) -> int:
    """Await ``send(caller)`` on the beat for ``seconds``; returns how many were sent."""
    start = time.monotonic() + 0.2
    period = callers / rate
    sent = 0

    async def one(i: int) -> None:
        nonlocal sent
        k = 0
        while True:
            at = start + (k + i / callers) * period
            if at - start > seconds or time.monotonic() - start > seconds:
                return  # (a flood is behind its schedule: wall time ends it)
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            await send(i)
            sent += 1
            k += 1

    await asyncio.gather(*(one(i) for i in range(callers)))
    return sent
