"""A job's status: the five values of ``jobq.job.status``.

Its own module because both sides use it: the handler-facing ``job.py``
(re-exported there) and the lease, the rows and the operator verbs, which
``job.py`` must not import at module level."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    QUEUED = "queued"
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A job in one of these has ended for good (client.result, client.stream).
TERMINAL = frozenset({Status.COMPLETED.value, Status.FAILED.value, Status.CANCELLED.value})
