"""A fleet's histograms, read from each process's /metrics (the health port),
and their quantiles over a window, as Prometheus' histogram_quantile computes
them: the bucket that holds the quantile, linearly interpolated inside it."""

from __future__ import annotations

import re
import urllib.request

Buckets = dict[float, float]  # upper bound -> cumulative count


def buckets(name: str, ports: list[int]) -> Buckets:
    """The histogram ``name`` summed over the processes on ``ports``."""
    line = re.compile(rf'^{re.escape(name)}_bucket\{{le="([^"]+)"\}} ([0-9.e+]+)$', re.M)
    total: Buckets = {}
    for port in ports:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        except OSError:
            continue
        for le, count in line.findall(text.decode()):
            bound = float("inf") if le == "+Inf" else float(le)
            total[bound] = total.get(bound, 0.0) + float(count)
    return total


def count(before: Buckets, after: Buckets) -> int:
    return int(after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0))


def quantile_ms(before: Buckets, after: Buckets, q: float) -> float | None:
    """Quantile ``q`` of what was observed between the two reads, in ms
    (None: nothing observed; the last finite bound if it lies beyond it)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    low_bound, low_count = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts):
        if cumulative >= rank:
            if bound == float("inf"):
                return round(low_bound * 1000, 2)
            inside = (rank - low_count) / max(cumulative - low_count, 1e-9)
            return round((low_bound + (bound - low_bound) * inside) * 1000, 2)
        low_bound, low_count = bound, cumulative
    return None
