"""When a reaper wakes: what it knows is coming, what it is told, and how
long it may sleep when nothing is going on (issue #37).

Busy (a job active, due or parked), a reaper sleeps until the next lease
deadline, relay time or schedule slot its probe saw, at most ``max_sleep_s``.
Idle, it sleeps up to ``idle_sleep_s``, so an idle fleet costs the database
one probe per ``idle_sleep_s`` and little else. Three things keep that safe:

- the idle sleep never outlasts the shortest queue lease: a job claimed
  just after the probe cannot lapse before the next one (I3 holds from the
  last renewal, whatever the reaper was doing);
- NOTIFYs at commit wake it: ``jobq_relay`` (a job nobody else publishes:
  SQL enqueues, released dependants) always; ``jobq_delayed`` (a row due
  later: a delay, a debounce, a retry, by schema 0020's trigger; a
  schedule set) and ``jobq_busy`` (a consumer that ran nothing claimed
  jobs) when it sleeps past ``max_sleep_s``, so a stream of them costs a
  busy reaper nothing extra. ``jobq_busy`` is what
  keeps the vanished-session path fast: a consumer killed right after an
  idle spell is noticed at the busy pace, not an idle sleep later;
- without a LISTEN session (it could not be opened) there is no long
  sleep at all: the NOTIFYs are what makes it safe;
- any NOTIFY since the last sleep began keeps the next sleep short:
  activity is the sign that more is coming, and a stream of delayed
  publishes then finds the reaper at the busy pace, not woken by each.

LISTEN is best effort; polling is the floor.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from jobq.rows import Probe
from jobq.settings import ReaperSettings

log = logging.getLogger("jobq.reaper")


class Wakes:
    def __init__(self, session_url: str, cfg: ReaperSettings) -> None:
        self._url = session_url
        self._cfg = cfg
        self.event = asyncio.Event()
        self._listener: asyncpg.Connection | None = None
        self._told = False  # a NOTIFY since the last sleep began
        self._long = False  # sleeping past max_sleep_s now

    def set(self) -> None:
        self.event.set()

    @property
    def told(self) -> bool:
        """A NOTIFY arrived since the last sleep began."""
        return self._told

    async def listen(self) -> None:
        """(Re)open the LISTEN session if it is gone; never raises."""
        if self._listener is not None and not self._listener.is_closed():
            return
        try:
            self._listener = await asyncpg.connect(self._url, timeout=5)
            await self._listener.add_listener("jobq_relay", self._on_relay)
            await self._listener.add_listener("jobq_delayed", self._on_delayed)
            await self._listener.add_listener("jobq_busy", self._on_delayed)
        except Exception as exc:  # polling still works; try again next loop
            self._listener = None
            log.debug("LISTEN unavailable: %r", exc)

    async def close(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            await self._listener.close()

    def before_probe(self) -> None:
        """A new loop: what woke it, its probe will see."""
        self.event.clear()

    def sleep_for(self, probe: Probe) -> float:
        """Seconds to sleep after a sweep that ended with ``probe``."""
        listening = self._listener is not None and not self._listener.is_closed()
        idle_s = self._cfg.idle_sleep_s if listening and not self._told else None
        self._told = False
        sleep_s = probe.sleep_s(self._cfg.max_sleep_s, self._cfg.wake_slack_s, idle_s)
        self._long = sleep_s > self._cfg.max_sleep_s
        return sleep_s

    async def sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.event.wait(), timeout=seconds)
        except TimeoutError:
            pass
        self._long = False

    def _on_relay(self, *_: object) -> None:
        self._told = True
        self.event.set()

    def _on_delayed(self, *_: object) -> None:
        self._told = True
        if self._long:
            self.event.set()
