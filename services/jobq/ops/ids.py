"""Short ids: the first hex digits of a job's or workflow's id, as the
dashboard and the CLI print them, accepted wherever an id is asked for
(``jobq inspect``, the dashboard's find box), as a range of the primary key."""

from __future__ import annotations

import re
import uuid

_HEX = re.compile(r"[0-9a-f]{8,32}")


def id_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids a short id stands for (the 8+ leading hex digits the pages
    and the CLI print, hyphens and a trailing ellipsis allowed), as the
    lowest and highest: a range the primary key answers. None if it is not one."""
    digits = text.strip().rstrip("…").rstrip(".").replace("-", "").lower()
    if not _HEX.fullmatch(digits):
        return None
    pad = 32 - len(digits)
    return uuid.UUID(digits + "0" * pad), uuid.UUID(digits + "f" * pad)
