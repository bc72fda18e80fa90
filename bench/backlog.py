"""A deep backlog (issue #37): 1,000,000 jobs queued, against 10,000.

    .venv/bin/python bench/backlog.py [--depths 10000 1000000] [--window 8000]

For each depth, in a scratch database and namespace of its own:

1. ``publish_many`` of 1,000 no-op jobs from 4 concurrent tasks of one
   ``Client`` until the depth is queued, nothing consuming (the enqueue rate
   is printed too);
2. with that backlog standing, a reaper's sweep as its loop runs it
   (``probe``, ``run_once`` of what it found, ``probe``; 20 times) and its
   lost-message check (``check_lost``, 5 times; and the broker's answer to
   its question alone, how many messages are ready) timed in this process:
   the median and the slowest; again after 30 s;
3. then 2 consumers of concurrency 32 start and drain. Over the window from
   the 1,000th job finished to the (1,000 + --window)th, by the database
   clock: the drain rate, and the claim statement's p50 / p99 from the
   consumers' ``jobq_claim_duration_seconds`` histograms (bench/scrape.py).
   At 1 M the queue is still ~990,000 deep through the window; at 10 k it
   runs from 9,000 down to 1,000.

The ratios (1 M / 10 k) are printed last: the target is ≤ 1.2 for claim p99
and ≥ 1 / 1.2 for the drain rate, and sweep and check times that stay flat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import scrape
from benchenv import world

from harness.helpers import free_port
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.reaper.service import Reaper
from jobq.settings import Settings

CLAIM = "jobq_claim_duration_seconds"
WARM = 1_000  # jobs finished before the window opens (consumers' start-up)
SETTLE_S = 30


async def fill(settings: Settings, depth: int) -> float:
    """Publish ``depth`` jobs; returns jobs/s."""
    left = depth

    async def one(client: Client) -> None:
        nonlocal left
        while left > 0:
            n = min(1_000, left)
            left -= n
            await client.publish_many([NewJob("noop", {}) for _ in range(n)])

    started = time.monotonic()
    async with Client(settings) as client:
        await asyncio.gather(*(one(client) for _ in range(4)))
    return depth / (time.monotonic() - started)


async def reaper_times(settings: Settings) -> dict[str, float]:
    reaper = Reaper(settings)
    await reaper.connect(wait=False)
    try:
        sweeps, checks = [], []
        for _ in range(20):
            started = time.perf_counter()
            await reaper.run_once(await reaper.probe())  # as the loop does
            await reaper.probe()
            sweeps.append(time.perf_counter() - started)
        asks = []  # the check's question to the broker alone: how many ready
        for _ in range(5):
            started = time.perf_counter()
            await reaper.check_lost()
            checks.append(time.perf_counter() - started)
            started = time.perf_counter()
            await reaper.broker.ready_count("noop")
            asks.append(time.perf_counter() - started)
    finally:
        await reaper.close()
    return {"sweep_median_ms": round(statistics.median(sweeps) * 1000, 2),
            "sweep_max_ms": round(max(sweeps) * 1000, 2),
            "lost_check_median_ms": round(statistics.median(checks) * 1000, 2),
            "lost_check_max_ms": round(max(checks) * 1000, 2),
            "of_which_broker_ready_count_median_ms": round(statistics.median(asks) * 1000, 2)}


def one_depth(depth: int, window: int) -> dict[str, Any]:
    with world(("noop",), f"backlog-{depth}") as w:
        out: dict[str, Any] = {"depth": depth}
        out["enqueue_jobs_per_s"] = round(asyncio.run(fill(w.settings, depth)), 1)
        time.sleep(1)  # the producer's marks written
        out["queued"] = w.db.val("SELECT count(*) FROM jobq.job WHERE status = 'queued'")
        out.update(asyncio.run(reaper_times(w.settings)))
        time.sleep(SETTLE_S)  # and again once the broker has written the backlog away
        out["after_settling"] = asyncio.run(reaper_times(w.settings))
        ports = [free_port(), free_port()]
        for port in ports:
            w.procs.start("consume", "noop_app:app", "--concurrency", "32",
                          environ={"JOBQ_HEALTH_PORT": str(port),
                                   "JOBQ_HEALTH_HOST": "127.0.0.1",
                                   "PYTHONPATH": f"{HERE}{os.pathsep}{w.procs.env['PYTHONPATH']}"})

        def finished() -> int:
            return int(w.db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'"))

        deadline = time.monotonic() + 300
        while finished() < WARM and time.monotonic() < deadline:
            time.sleep(0.05)
        before = scrape.buckets(CLAIM, ports)
        while finished() < WARM + window and time.monotonic() < deadline:
            time.sleep(0.05)
        after = scrape.buckets(CLAIM, ports)
        span = w.db.val(
            "SELECT extract(epoch FROM max(finished_at) - min(finished_at)) FROM (SELECT "
            "finished_at FROM jobq.job WHERE status = 'completed' ORDER BY finished_at "
            "OFFSET $1 LIMIT $2) t", WARM, window)
        out.update({
            "drain_jobs_per_s": round(window / float(span), 1),
            "claim_p50_ms": scrape.quantile_ms(before, after, 0.5),
            "claim_p99_ms": scrape.quantile_ms(before, after, 0.99),
            "claim_statements": scrape.count(before, after),
            "queued_at_window_end": w.db.val(
                "SELECT count(*) FROM jobq.job WHERE status = 'queued'"),
        })
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int, nargs="*", default=[10_000, 1_000_000])
    ap.add_argument("--window", type=int, default=8_000)
    a = ap.parse_args()
    if min(a.depths) < WARM + a.window:
        ap.error(f"every depth must hold the window: at least {WARM + a.window}")
    runs = []
    for depth in a.depths:
        runs.append(one_depth(depth, a.window))
        print(json.dumps(runs[-1]), flush=True)
    if len(runs) == 2:
        small, deep = runs
        ratios = {k: round(deep[k] / small[k], 3) for k in (
            "claim_p50_ms", "claim_p99_ms", "drain_jobs_per_s", "sweep_median_ms",
            "lost_check_median_ms", "of_which_broker_ready_count_median_ms")
            if deep.get(k) and small.get(k)}
        ratios.update({f"{k} after settling": round(
            deep["after_settling"][k] / small["after_settling"][k], 3)
            for k in ("sweep_median_ms", "lost_check_median_ms")
            if deep["after_settling"].get(k) and small["after_settling"].get(k)})
        print(json.dumps({"deep / small": ratios}), flush=True)


if __name__ == "__main__":
    main()
