"""What the ``jobq`` verbs share: durations (``7d``), job ids and JSON
payloads from the command line, one admin action on a short-lived pool, and
the tables the verbs print."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from jobq.errors import BadInput
from jobq.settings import Settings
from jobq.telemetry.logs import printable

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

def parse_duration(text: str, *, unit_required: bool = False) -> float:
    """'90s', '15m', '12h', '7d', '2w' (or plain seconds) -> seconds."""
    t = text.strip().lower()
    try:
        if t and t[-1] in _UNITS:
            value = float(t[:-1]) * _UNITS[t[-1]]
        elif unit_required:
            raise BadInput(f"bad duration {text!r}: give a unit (s, m, h, d or w), e.g. 7d; "
                           "a bare number is ambiguous here")
        else:
            value = float(t)
    except ValueError:
        raise BadInput(f"bad duration {text!r}: use a number with s, m, h, d or w, "
                       "e.g. 7d") from None
    if value < 0 or not math.isfinite(value):
        raise BadInput(f"bad duration {text!r}: must be a positive, finite duration")
    return value

def parse_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise BadInput(f"{text!r} is not a job id (expected a UUID)") from None

def decode(text: str, where: str = "payload") -> Any:
    """A payload from JSON text (jobq publish, jobq schedule set); BadInput
    that says what is wrong, also for what json cannot take (too deep)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{where} is not valid JSON ({exc}); e.g. '{{\"to\": \"a@b.c\"}}'") \
            from None
    except (RecursionError, ValueError) as exc:  # nested too deep, a 5,000-digit number
        raise BadInput(f"{where} cannot be decoded: {type(exc).__name__}: {str(exc)[:120]}") \
            from None

async def pool(settings: Settings) -> Any:
    from jobq.db import open_pool

    return await open_pool(settings.database_url, wait=False, app_name="jobq-cli",
                           pooled=settings.database_pooled)

async def admin_call(settings: Settings, action: str, *args: Any) -> Any:
    """Run one admin action on a short-lived pool."""
    from jobq.ops import admin

    p = await pool(settings)
    try:
        return await getattr(admin, action)(p, *args)
    finally:
        await p.close()

def table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("(none)")
        return
    cols = list(rows[0])
    cells = [[("" if r[c] is None else printable(str(r[c]), 200)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
