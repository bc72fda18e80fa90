"""What a job whose payload fails its handler's model is told.

One line that names the queue and every error (at most ``MAX_ERRORS``, each
with where it is), the same wherever the payload is checked: by a producer's typed handle
before it publishes, by the consumer before a handler runs, or by a
``--pool process`` child.
"""

from __future__ import annotations

from pydantic import ValidationError

MAX_ERRORS = 10


def every_error(exc: ValidationError) -> str:
    """``2 error(s): Field required at to; ... and 3 more``: all of them,
    not the first (a payload with two mistakes once showed one)."""
    parts = []
    for err in exc.errors()[:MAX_ERRORS]:
        where = ".".join(map(str, err["loc"])) or "payload"
        parts.append(f"{err['msg']} at {where}")
    more = exc.error_count() - len(parts)
    return (f"{exc.error_count()} error(s): " + "; ".join(parts)
            + (f"; and {more} more" if more > 0 else ""))


def validation_failure(queue: str, exc: ValidationError) -> str:
    """``payload failed validation for queue q: 2 error(s): ... at to; ...``."""
    return f"payload failed validation for queue {queue}: {every_error(exc)}"
