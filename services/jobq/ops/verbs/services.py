"""``jobq consume``, ``reap`` and ``dashboard``: the long-running services.
Each sets up its own event loop (uvloop when installed), so these are
plain functions; the dashboard is a coroutine like the other verbs."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from typing import Any

from pydantic import ValidationError

from jobq.errors import ConfigError
from jobq.settings import Settings


def register(sub: Any) -> None:
    con = sub.add_parser(
        "consume", help="run handlers of APP (module:attribute)",
        description="Run a consumer until SIGTERM or Ctrl-C: it claims jobs of APP's queues, "
        "renews their leases while the handlers run, and records how each ended. On SIGTERM it "
        "stops taking jobs, lets running ones finish within JOBQ_CONSUMER__SHUTDOWN_GRACE_S and "
        "releases the rest at once, uncharged. JOBQ_HEALTH_PORT serves /healthz, /readyz, "
        "/metrics.")
    con.add_argument("app", metavar="APP", help="e.g. jobq.demo:app")
    con.add_argument("--queue", "-q", action="append", dest="queues", metavar="Q",
                     help="queue to consume (repeatable; default: every queue APP handles)")
    con.add_argument("--concurrency", "-c", type=int, default=None, metavar="N",
                     help="jobs run at once by this process (default JOBQ_CONSUMER__CONCURRENCY)")
    con.add_argument("--pool", choices=("thread", "process"), default=None,
                     help="where sync handlers run: a thread pool (default) or pre-started "
                          "child processes, one per slot: a child's death is charged to its "
                          "job alone, and lease loss or a timeout stops the handler "
                          "(JOBQ_CONSUMER__POOL)")
    con.add_argument("--max-jobs-per-child", type=int, default=None, metavar="N",
                     help="--pool process: replace a child after N jobs")
    con.add_argument("--max-memory-per-child", type=float, default=None, metavar="MB",
                     help="--pool process: replace a child whose RSS is over MB after a job")
    con.set_defaults(run=consume)

    reap_ = sub.add_parser("reap", help="requeue lapsed leases and publish what is due",
                   description="Run a reaper until SIGTERM: requeue jobs whose lease lapsed "
                   "(charging a stall only on evidence, see README), publish retries, delayed "
                   "and SQL-enqueued jobs when due, republish ids the broker lost, prune "
                   "finished jobs by their queue's retention. Run any number: they are peers. "
                   "JOBQ_HEALTH_PORT serves /healthz, /readyz and /metrics.")
    reap_.set_defaults(run=reap)

    dash = sub.add_parser(
        "dashboard", help="serve the web dashboard (read-only unless --allow-actions)",
        description="Queues, running, stalled, failed, each job's timeline, workers and "
        "reapers, as web pages. Pages read as jobq_reader when the login is a member of it. "
        "--allow-actions lets operators who sign in with JOBQ_DASHBOARD_TOKEN retry and "
        "cancel jobs (written to the job's history with their name).")
    dash.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    dash.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    dash.add_argument("--refresh", type=int, default=5, metavar="SECONDS",
                      help="pages reload themselves this often (default 5; 0 = never)")
    dash.add_argument("--allow-actions", action="store_true",
                      help="retry and cancel buttons, for operators signed in with the token")
    dash.set_defaults(run=dashboard)


def consume(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.app import load
    from jobq.worker.consumer import Consumer

    # Everything jobq imports is imported before the working directory joins
    # the path for APP: a stray uvloop.py there never runs.
    _install_uvloop(settings)
    sys.path.insert(0, os.getcwd())
    app = load(args.app)
    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    pool_flags = {"pool": args.pool, "max_jobs_per_child": args.max_jobs_per_child,
                  "max_memory_per_child_mb": args.max_memory_per_child}
    chosen = {k: v for k, v in pool_flags.items() if v is not None}
    if chosen:
        try:
            cfg = settings.consumer.model_validate({**settings.consumer.model_dump(), **chosen})
        except ValidationError as exc:
            raise ConfigError(f"bad --{exc.errors()[0]['loc'][0]}: "
                              f"{exc.errors()[0]['msg']}") from exc
        settings = settings.model_copy(update={"consumer": cfg})
    consumer = Consumer(app, settings, args.queues, args.concurrency, app_spec=args.app)
    _freeze_heap()
    asyncio.run(consumer.run())
    # Sync handlers still running in threads must not keep a process whose
    # leases were released alive.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


def reap(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.reaper import Reaper

    _install_uvloop(settings)
    reaper = Reaper(settings)
    _freeze_heap()
    asyncio.run(reaper.run())


async def dashboard(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.dashboard.server import serve

    await serve(settings, args.host, args.port, args.allow_actions, args.refresh)


def _freeze_heap() -> None:
    """The cyclic collector, tuned for a service that allocates a few short-
    lived objects per job: what start-up imported and built lives as long as
    the process and leaves the collector's sight (gc.freeze), and the young
    generation is collected every 10,000 allocations instead of 700.
    py-spy --native on a c16 drain: gc_collect_main 9.6 -> 4.0 % of a
    consumer's samples; the drain x1.079 (bench/README.md, #49)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def _install_uvloop(settings: Settings) -> None:
    if settings.event_loop == "asyncio":
        return
    try:
        import uvloop  # optional: faster event loop (pip install jobq[fast])

        uvloop.install()
    except ImportError:
        if settings.event_loop == "uvloop":
            raise ConfigError("JOBQ_EVENT_LOOP=uvloop, but uvloop is not installed: "
                              "pip install 'jobq[fast]'") from None
