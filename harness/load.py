"""Load and faults that tests and benchmarks both apply: a steady producer of
single-job publishes, a killer of database backends, and the re-run clock
of a recovery (kill -> each job's next start, on the database clock)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from typing import Any

from harness.helpers import SyncDB


def produce(settings: Any, rate: float, for_s: float, out: list[Any],
            queue: str = "work", payload: Any = None, refused: list[Any] | None = None) -> float:
    """Publish single jobs at ``rate`` a second for ``for_s`` (each tick's
    publishes concurrent, as a web app's requests are); appends the ids to
    ``out`` and returns the rate actually reached. With ``refused``, a
    publish that raises (the database away: the caller is told, nothing was
    promised) is appended there instead of failing the run."""
    from jobq.client.producer import Client

    async def go() -> float:
        async with Client(settings) as client:
            started = time.monotonic()
            deadline = started + for_s
            while time.monotonic() < deadline:
                tick = time.monotonic()
                got = await asyncio.gather(*(
                    client.publish(queue, {"sleep": 0.001} if payload is None else payload)
                    for _ in range(int(rate / 10))), return_exceptions=refused is not None)
                for g in got:
                    if isinstance(g, BaseException):
                        assert refused is not None
                        refused.append(g)
                    else:
                        out.append(g)
                await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
            return len(out) / (time.monotonic() - started)

    # A node stopped or a primary crashed under this client leaves the
    # drivers' half-open sockets of failed reconnection attempts to the
    # garbage collector. Collected later, their ResourceWarning landed in
    # whatever test ran next in this process (seen in CI, in
    # test_backend_kills); collected by an automatic pass while this client
    # still ran, it failed the fault test itself (CI, test_failover[sync],
    # an asyncpg socket reset mid-TLS-request by the crashing primary). So:
    # ignored while this client runs (warnings filters are process-wide: the
    # test's own thread is covered too meanwhile), and collected before it
    # returns. The services under test are other processes; their logs are
    # checked.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return asyncio.run(go())
        finally:
            gc.collect()


def kill_backends(url: str, app_name: str, every_s: float, stop: threading.Event,
                  for_s: float = float("inf")) -> int:
    """pg_terminate_backend on every session whose application_name is LIKE
    ``app_name``, every ``every_s``, until ``stop`` or ``for_s``; returns how
    many were terminated."""
    db = SyncDB(url)
    killed = 0
    try:
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline and not stop.is_set():
            killed += db.val("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                             "WHERE application_name LIKE $1 AND datname = current_database()",
                             app_name)
            time.sleep(every_s)
    finally:
        db.close()
    return killed


def rerun_latencies(db: SyncDB, ids: list[Any], killed_at: Any) -> list[float]:
    """Seconds from a kill (a database timestamp) to each job's first start
    after it, for every job that started again; sorted."""
    rows = db.fetch("SELECT extract(epoch FROM min(started_at) - $2)::float8 AS s "
                    "FROM test_run WHERE job_id = ANY($1) AND started_at > $2 "
                    "GROUP BY job_id", ids, killed_at)
    return sorted(r["s"] for r in rows)
