"""What consumer and reaper share as long-running services: stop signals,
health endpoints, and start-up waits that a SIGTERM can interrupt (a service waiting for a
database that is down must still stop when asked)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import asyncpg

from jobq.db import ping
from jobq.runtime.health import Check, HealthServer

if TYPE_CHECKING:
    from jobq.settings import Settings

T = TypeVar("T")


async def start_health(settings: Settings, live: Callable[[], bool],
                       ready: Check) -> HealthServer | None:
    if settings.health_port is None:
        return None
    server = HealthServer(settings.health_host, settings.health_port, live, ready)
    await server.start()
    return server


async def database_answers(pool: asyncpg.Pool | None) -> bool:
    if pool is None:
        return False
    try:
        return await asyncio.wait_for(ping(pool), 2)
    except Exception:
        return False


def install_stop_signals(stop: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass


def remove_stop_signals() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.remove_signal_handler(sig)
        except (NotImplementedError, RuntimeError):
            pass


async def lifecycle(settings: Settings, stop: asyncio.Event, request_stop: Callable[[], None],
                    live: Callable[[], bool], ready: Check,
                    connect: Callable[[], Awaitable[None]], serve: Callable[[], Awaitable[None]],
                    close: Callable[[], Awaitable[None]]) -> None:
    """The one shape of every jobq service: stop signals and health first,
    then connect (waiting for what can heal, unless a stop comes first),
    serve until stopped, and close whatever happened."""
    from jobq.runtime import crash

    crash.configure(settings.crash_at)
    install_stop_signals(request_stop)
    health = await start_health(settings, live, ready)
    try:
        started, _ = await unless_stopped(connect(), stop)
        if started:
            await serve()
    finally:
        remove_stop_signals()
        try:
            await close()
        finally:
            if health is not None:
                await health.stop()


async def unless_stopped(work: Awaitable[T], stopped: asyncio.Event) -> tuple[bool, T | None]:
    """Run ``work`` until it ends or ``stopped`` is set: (finished, result)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.create_task(stopped.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task in done:
        return True, task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False, None
