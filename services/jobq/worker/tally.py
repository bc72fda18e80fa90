"""Counters of one consumer process: a plain Counter for tests and the
final log line, and the Prometheus series behind /metrics. Labelled metric
children are looked up once per (what, queue) and cached: ``labels()`` on
every job cost measurable time on the hot path."""

from __future__ import annotations

import collections
from typing import Any

from jobq.telemetry import metrics

_METRIC = {"claimed": metrics.JOBS_CLAIMED, "completed": metrics.JOBS_COMPLETED,
           "retried": metrics.JOBS_RETRIED, "failed": metrics.JOBS_FAILED,
           "released": metrics.JOBS_RELEASED, "lease_lost": metrics.LEASES_LOST,
           "child_died": metrics.CHILD_DEATHS, "snoozed": metrics.JOBS_SNOOZED,
           "suspended": metrics.JOBS_SUSPENDED}


class Tally:
    def __init__(self) -> None:
        self.counters: collections.Counter[str] = collections.Counter()
        self._children: dict[tuple[str, ...], Any] = {}

    def count(self, what: str, queue: str) -> None:
        self.counters[what] += 1
        child = self._children.get((what, queue))
        if child is None:
            child = self._children[what, queue] = _METRIC[what].labels(queue)
        child.inc()

    def drop(self, reason: str, n: int = 1) -> None:
        """A delivery not run (malformed, unknown job, duplicate, ...)."""
        self.counters[reason] += n
        metrics.BAD_MESSAGES.labels(reason).inc(n)

    def handed_back(self, queue: str, n: int) -> None:
        """Held ids of a packed message published back to the fleet."""
        self.counters["handed_back"] += n
        metrics.IDS_HANDED_BACK.labels(queue).inc(n)

    def note(self, what: str, n: int = 1) -> None:
        """A plain counter with no metric (claim retries and the like)."""
        self.counters[what] += n

    def handler_time(self, queue: str, outcome: str, seconds: float) -> None:
        child = self._children.get(("handler", queue, outcome))
        if child is None:
            child = self._children["handler", queue, outcome] = \
                metrics.HANDLER_SECONDS.labels(queue, outcome)
        child.observe(seconds)
