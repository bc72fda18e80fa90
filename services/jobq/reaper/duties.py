"""A sweep's duties, as a table (River's queue_maintainer, Oban's plugins):
each says when it has anything to do (from the sweep's one probe statement
and what the duties before it did) and does it through the reaper's store.
``service.py`` runs the table in order; each duty fails alone (logged in one
line, recorded in the sweep), so no queue, schedule or row can stop the
others.

    cut         leases of vanished workers cut to their grace (rescue.py)
    requeue     lapsed leases requeued, or failed as jobs of death (rescue.py)
    schedules   due schedule slots fired, once per slot (periodic.py)
    expire      unstarted jobs past their deadline cancelled (expired)
    supersede   a latest key's older queued jobs cancelled (schema 0042)
    unpark      jobs a limit parked, released as slots free
    wake        jobs suspended for a signal that came, made due (issue #52)
    dependants  edges of jobs published after others settled (dependants.py)
    relay       due rows nobody published, published: what the duties before
                put back in line goes out in this very sweep

Requeues commit before anything is published: a consumer that got the id
while the row was still active would drop the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from jobq.reaper.dependants import settle
from jobq.reaper.periodic import fire_due
from jobq.reaper.rescue import cut_vanished, requeue_lapsed
from jobq.reaper.store import ReaperStore
from jobq.rows import Probe
from jobq.runtime import crash
from jobq.settings import ReaperSettings


@dataclass
class Sweep:
    vanished: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    fired: int = 0
    unparked: int = 0
    woken: int = 0
    expired: int = 0
    superseded: int = 0
    released: int = 0
    published: int = 0
    more: bool = False  # a bounded duty stopped with work left: sweep again at once
    duration_s: float = 0.0
    errors: dict[str, Exception] = field(default_factory=dict)  # duty -> what it raised


class Duty(Protocol):
    name: str

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        """Whether it has anything to do in this sweep."""

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        """Do it, recording what it did in ``sweep``."""


class Cut:
    name = "cut"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.vanished or probe.active

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        sweep.vanished += await cut_vanished(store)


class Requeue:
    name = "requeue"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.active

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        requeued, failed = await requeue_lapsed(store, cfg.batch_size, reaper_id)
        sweep.requeued += requeued
        sweep.failed += failed
        if requeued or failed:
            crash.point("reaper.after_requeue")


class Schedules:
    name = "schedules"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.schedules_due

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        sweep.fired += await fire_due(store)


class Expire:
    name = "expire"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.expiring

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        sweep.expired += await store.expire_due(cfg.batch_size)
        if sweep.expired >= cfg.batch_size:
            sweep.more = True  # more past their deadline: sweep again at once


class Supersede:
    name = "supersede"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.superseding

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        got = await store.supersede_pending(cfg.batch_size)
        sweep.superseded += got.cancelled
        if got.more:  # it took its limit of notes, not of cancelled jobs:
            sweep.more = True  # more may be noted, sweep again at once


class Unpark:
    name = "unpark"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.parked

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        sweep.unparked += await store.unpark()


class Wake:
    name = "wake"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.signals

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        sweep.woken += await store.wake_signalled(cfg.batch_size)


class Dependants:
    name = "dependants"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return probe.dependants or sweep.expired > 0  # an expired job's dependants too

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        done = await settle(store, cfg.settle_budget, cfg.settle_rounds)
        sweep.released += done.released
        sweep.more = sweep.more or done.more


class Relay:
    name = "relay"

    def due(self, probe: Probe, sweep: Sweep) -> bool:
        return (probe.relay_due or bool(sweep.requeued) or sweep.fired > 0
                or sweep.unparked > 0 or sweep.released > 0 or sweep.woken > 0)

    async def run(self, store: ReaperStore, cfg: ReaperSettings, reaper_id: str,
                  sweep: Sweep) -> None:
        # at most max_sleep_s of it: requeues keep their pace behind a backlog (I3)
        sweep.published += await store.relay(cfg.batch_size, budget_s=cfg.max_sleep_s)


DUTIES: tuple[Duty, ...] = (Cut(), Requeue(), Schedules(), Expire(), Supersede(), Unpark(),
                             Wake(), Dependants(), Relay())
