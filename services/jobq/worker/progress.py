"""``await job.progress(value)``: a running job's progress on its row,
fenced like every worker write, at most one write a second per job (issue #17).

A handler may report in a tight loop: the latest value is kept and written
when a second has passed since the last write (a pending value is flushed
then, so the last one reported lands while the job runs). The value is a
number or a small JSON object (at most MAX_BYTES as JSON); it shows in
``jobq.running`` and ``jobq inspect``. A write that matches no row means the
lease is lost: the handler is stopped, as on a failed renewal.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from jobq.errors import BadInput, LeaseLost

if TYPE_CHECKING:  # the executor's units; progress.py is below them
    from jobq.worker.heartbeat import Heartbeat
    from jobq.worker.run import Run
    from jobq.worker.store import WorkerStore

MIN_INTERVAL_S = 1.0
MAX_BYTES = 4096


def _encode(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        raise BadInput("progress must be a number or a JSON object, got "
                       f"{type(value).__name__}")
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise BadInput(f"progress is not JSON: {exc}") from None
    if len(text) > MAX_BYTES:  # json.dumps escapes non-ASCII: characters are bytes
        raise BadInput(f"progress is {len(text)} bytes as JSON, over {MAX_BYTES}")
    return text


class ProgressWriter:
    def __init__(self, store: WorkerStore, run: Run, heartbeat: Heartbeat) -> None:
        self.store = store
        self.run = run
        self.heartbeat = heartbeat
        self._last = float("-inf")  # loop time of the last write
        self._pending: str | None = None
        self._flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def set(self, value: Any) -> None:
        text = _encode(value)
        if not self.run.ours:
            raise LeaseLost(f"job {self.run.job.id}: lease lost")
        loop = asyncio.get_running_loop()
        if loop.time() - self._last >= MIN_INTERVAL_S and self._flush is None:
            await self._write(text)
            return
        self._pending = text  # coalesced: written a second after the last write
        if self._flush is None:
            self._flush = loop.call_at(self._last + MIN_INTERVAL_S, self._flush_later)

    def _flush_later(self) -> None:
        self._flush = None
        text, self._pending = self._pending, None
        if text is not None and self.run.ours:
            task = asyncio.create_task(self._write(text, raise_lost=False))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, text: str, raise_lost: bool = True) -> None:
        self._last = asyncio.get_running_loop().time()
        try:
            ok = await self.store.progress(self.run.lease, text)
        except Exception:
            return  # progress is best effort: the database may be briefly away
        if not ok and self.run.ours and not self.run.lease.finishing:
            self.heartbeat.lose(self.run, "progress write matched no row: lapsed or cancelled")
            if raise_lost:
                raise LeaseLost(f"job {self.run.job.id}: lease lost")

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
