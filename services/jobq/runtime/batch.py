"""Group commit: coalesce concurrent single-item requests into one statement.

While one batch is in flight, new requests wait in line; when it returns,
everything that queued up meanwhile goes out as the next batch. At low load a
request goes out alone at once (no added latency); under load the per-job
database round trips shrink to one per batch. Semantics are those of the
batched statement: each item gets its own answer (an exception in the
results is raised to that item's caller alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from jobq.runtime.loops import RunningLoop

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    def __init__(self, run: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]],
                 max_batch: int = 256):
        self._run = run
        self._max = max_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._worker: asyncio.Task[None] | None = None
        self._loop = RunningLoop()  # one loop for the coalescer's life: asked once

    async def submit(self, item: T) -> R:
        fut: asyncio.Future[R] = self._loop().create_future()
        self._pending.append((item, fut))
        if self._worker is None or self._worker.done():
            self._worker = self._loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            try:
                results = await self._run([item for item, _ in batch])
            except BaseException as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, fut), res in zip(batch, results):
                if fut.done():
                    continue
                if isinstance(res, BaseException):  # this item's own refusal
                    fut.set_exception(res)
                else:
                    fut.set_result(res)
