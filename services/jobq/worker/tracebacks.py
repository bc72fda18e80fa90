"""A failure's traceback as text a job row can keep (issue #50).

``last_error`` says what failed (``KeyError: 'x'``); the traceback says
where: file, line and function of each frame. It is kept with the job
(``jobq.job.last_traceback``), shown by ``jobq inspect`` and the dashboard's
job page, and logged with the final failure. Bounded, because a handler's
exception is user data: the innermost MAX_FRAMES frames (where it broke,
not the consumer's own call path above the handler) and at most MAX_BYTES,
cut at the front so the exception line at the end is always there.
"""

from __future__ import annotations

import traceback

MAX_FRAMES = 20
MAX_BYTES = 8192
_CUT = "... (earlier lines cut)\n"


def text_of(exc: BaseException) -> str | None:
    """The exception's traceback (chained causes included), or None when it
    was never raised (jobq made it: a timeout, a child's death)."""
    if exc.__traceback__ is None:
        return None
    try:
        lines = traceback.format_exception(exc, limit=-MAX_FRAMES)
    except Exception:  # a broken __str__ must not cost the failure record
        return None
    return bounded("".join(lines))


def bounded(text: str) -> str:
    """At most MAX_BYTES of UTF-8, the end kept (the exception line)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_BYTES:
        return text.replace("\x00", "\\x00")
    keep = data[-(MAX_BYTES - len(_CUT)):].decode("utf-8", "ignore")
    return (_CUT + keep).replace("\x00", "\\x00")
