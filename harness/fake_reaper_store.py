"""A fake :class:`jobq.reaper.store.ReaperStore` for the duties' unit tests
(tests/unit/test_reaper_duties.py): each statement returns what the test
set, records that it ran, and raises what the test queued with
``fail_next(name, exc)``. The SQL itself is the integration tests' (and the
plan tests'); this holds the reaper's loop and its duties to their rules."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from jobq.rows import Backlog, DueSlot, Lapsed, Overdue, Probe, Settled, Superseded, Vanished


class FakeReaperStore:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.vanished: list[Vanished] = []
        self.lapsed: list[list[Lapsed]] = []  # one list a call
        self.due: list[DueSlot] = []
        self.fire_errors: dict[str, BaseException] = {}
        self.skipped: list[tuple[str, str]] = []
        self.unparked = 0
        self.woken = 0
        self.settled = Settled(0, 0, False)
        self.relayed = 0
        self.lost: dict[str, int | None] = {}
        self.pruned: list[int] = []  # one count a call
        self._raise: dict[str, list[BaseException]] = {}

    def fail_next(self, name: str, *excs: BaseException) -> None:
        self._raise.setdefault(name, []).extend(excs)

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if self._raise.get(name):
            raise self._raise[name].pop(0)

    def slot(self, name: str, late_s: float = 0.0) -> DueSlot:
        now = datetime.now(UTC)
        return DueSlot(name, "q", None, 60.0, "UTC", True, now - timedelta(seconds=late_s), now)

    async def probe(self) -> Probe:
        self._enter("probe")
        return Probe(False, False, False, False, False, None)

    async def cut_vanished(self) -> list[Vanished]:
        self._enter("cut_vanished")
        return self.vanished

    async def requeue_lapsed(self, limit: int, reaper_id: str) -> list[Lapsed]:
        self._enter("requeue_lapsed")
        return self.lapsed.pop(0) if self.lapsed else []

    async def schedules_due(self, limit: int) -> list[DueSlot]:
        self._enter("schedules_due")
        return self.due

    async def fire(self, slot: DueSlot, next_slot: datetime) -> tuple[uuid.UUID | None, bool]:
        self._enter("fire")
        if slot.name in self.fire_errors:
            raise self.fire_errors[slot.name]
        return uuid.uuid4(), False

    async def skip(self, slot: DueSlot, next_slot: datetime | None, why: str) -> None:
        self._enter("skip")
        self.skipped.append((slot.name, why))

    async def unpark(self) -> int:
        self._enter("unpark")
        return self.unparked

    async def wake_signalled(self, limit: int) -> int:
        self._enter("wake_signalled")
        return self.woken

    async def expire_due(self, limit: int) -> int:
        self._enter("expire_due")
        return 0

    async def supersede_pending(self, limit: int) -> Superseded:
        self._enter("supersede_pending")
        return Superseded(0, False)

    async def settle(self, budget: int, rounds: int) -> Settled:
        self._enter("settle")
        return self.settled

    async def relay(self, batch: int, budget_s: float | None) -> int:
        self._enter("relay")
        return self.relayed

    async def lost_candidates(self, after_s: float) -> list[str]:
        self._enter("lost_candidates")
        return list(self.lost)

    async def republish_lost(self, queue: str, after_s: float) -> int | None:
        self._enter("republish_lost")
        return self.lost[queue]

    async def prune_finished(self, batch: int) -> int:
        self._enter("prune_finished")
        return self.pruned.pop(0) if self.pruned else 0

    async def prune_keys(self) -> None:
        self._enter("prune_keys")

    async def prune_workers(self) -> None:
        self._enter("prune_workers")

    async def backlog(self, timeout_s: float) -> list[Backlog]:
        self._enter("backlog")
        return []

    async def record_sweep(self, reaper_id: str, sweeps: int, failing: str | None) -> Overdue:
        self._enter("record_sweep")
        self.last_failing: Any = failing
        return Overdue(0, 0.0)

    async def register(self, reaper_id: str, host: str, pid: int) -> None:
        self._enter("register")

    async def failed(self, reaper_id: str, why: str) -> None:
        self._enter("failed")

    async def gone(self, reaper_id: str) -> None:
        self._enter("gone")
