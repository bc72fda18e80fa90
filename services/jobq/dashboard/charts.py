"""The queues page's small chart: completions per minute over the last hour,
as an inline SVG polyline (no script, no library)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MINUTES = 60


def per_queue(rows: Iterable[Any]) -> dict[str, list[int]]:
    """queue -> 60 counts, index 0 = this minute, 59 = an hour ago."""
    out: dict[str, list[int]] = {}
    for r in rows:
        series = out.setdefault(r["queue"], [0] * MINUTES)
        if 0 <= r["minutes_ago"] < MINUTES:
            series[r["minutes_ago"]] = int(r["n"])
    return out


def sparkline(series: list[int], width: int = 180, height: int = 28) -> str:
    """An SVG of the series, oldest on the left; empty for no data."""
    if not series:
        return ""
    top = max(series) or 1
    step = width / (MINUTES - 1)
    points = " ".join(f"{(MINUTES - 1 - i) * step:.1f},{height - 2 - v / top * (height - 4):.1f}"
                      for i, v in enumerate(series))
    return (f'<svg class="spark" width="{width}" height="{height}" role="img" '
            f'aria-label="completions per minute, last hour (max {top})">'
            f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" '
            f'points="{points}"/></svg>')
