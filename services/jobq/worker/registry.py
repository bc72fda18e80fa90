"""The worker registry session: one dedicated connection per consumer
process that holds a session-level advisory lock for the process's life.

When the process dies, PostgreSQL ends the session and the lock vanishes at
once; reapers see that within a sweep and cut the worker's leases to the
queue's ``vanished_grace_s`` (see ``jobq.worker`` in the schema). Renewals
are sent on this same session, so a successful renewal also proves it alive.

If the session ends while the process lives (a blip, an admin, a failover),
:class:`Registry` tells the heartbeat at once (``on_lost``: leases are now
trusted for their grace only) and re-registers with a fresh lock; once back
(``on_registered``) every lease is renewed immediately.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import Callable

import asyncpg

from jobq.db import SESSION_SETTINGS, missing_right
from jobq.errors import ConfigError
from jobq.runtime.backoff import Backoff
from jobq.telemetry.logs import fields
from jobq.worker import store

log = logging.getLogger("jobq.consumer")


class Registry:
    def __init__(self, database_url: str, worker_id: str, on_lost: Callable[[float], None],
                 on_registered: Callable[[], None], pool_kind: str = "thread",
                 declared: str | None = None) -> None:
        self._url = database_url
        self.worker_id = worker_id
        self.pool_kind = pool_kind  # --pool: requeue_lapsed judges a dead worker by it
        self.declared = declared  # its app's retry options (JSON), for jobq queue list
        self._on_lost = on_lost
        self._on_registered = on_registered
        self.conn: asyncpg.Connection | None = None  # None while not registered
        self.registered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="jobq-registry")

    def reset(self) -> None:
        """The session is in an unknown state (a driver error on it): end it;
        the loop re-registers."""
        if self.conn is not None and not self.conn.is_closed():
            self.conn.terminate()

    async def _session(self) -> None:
        conn = await asyncpg.connect(
            self._url, timeout=5,
            server_settings={"application_name": "jobq-consumer-registry", **SESSION_SETTINGS})
        try:
            if conn.get_server_version().major >= 14:
                # A session this process gave up on (a renewal that timed out
                # on a cut network: reset() ends it) must not live on in the
                # server holding its advisory lock, or re-registering is
                # refused until it ends: the server checks the client is still
                # there while a statement runs.
                await store.session_checks_clients(conn)
            ended = asyncio.Event()
            conn.add_termination_listener(lambda _c: ended.set())
            key = random.randrange(1, 2**31)
            while not await store.lock_session(conn, key):
                key = random.randrange(1, 2**31)
            if not await store.register(conn, self.worker_id, socket.gethostname(), os.getpid(),
                                        key):
                # Our earlier session may still hold its lock for a moment
                # after a broken connection: the loop tries again.
                raise RuntimeError(f"worker id {self.worker_id} is registered by a live "
                                   "session")
            await store.say(conn, self.worker_id, self.pool_kind, self.declared)
            self.conn = conn
            self.registered.set()
            self._on_registered()
            await ended.wait()
        finally:
            if not conn.is_closed():
                conn.terminate()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(0.1, 1.0)
        while True:
            try:
                await self._session()
                backoff.reset()  # it was up: come back at once
            except asyncio.CancelledError:
                raise
            except asyncpg.exceptions.InsufficientPrivilegeError as exc:
                # Not healed by retrying: the task ends, and the consumer with it.
                raise ConfigError(missing_right(str(exc))) from exc
            except Exception as exc:
                log.warning("worker registry session unavailable: %s; retrying", exc,
                            extra=fields(worker=self.worker_id))
            if self.conn is not None:
                self.conn = None
                log.warning("worker registry session ended; re-registering (leases are "
                            "trusted for their grace period only until then)",
                            extra=fields(worker=self.worker_id))
                self._on_lost(loop.time())
            await backoff.sleep()

    async def wait_registered(self) -> None:
        """Until registered; raises what ended the registry (a missing right)."""
        assert self._task is not None
        waiter = asyncio.ensure_future(self.registered.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            waiter.cancel()
            self._task.result()

    @property
    def task(self) -> asyncio.Task[None]:
        assert self._task is not None
        return self._task

    async def deregister(self) -> None:
        """Graceful stop: say we are gone (nothing to cut), end the session."""
        conn = self.conn
        if conn is not None and not conn.is_closed():
            try:
                # The heartbeat is stopped before this, and the loop only
                # waits for the session to end: nothing else uses conn now.
                await asyncio.wait_for(store.deregister(conn, self.worker_id), 5)
            except Exception as exc:  # best effort: the reaper copes either way
                log.debug("deregister: %r", exc)
        if self._task is not None:
            self._task.cancel()  # its session's finally ends the connection
            await asyncio.gather(self._task, return_exceptions=True)
        self.conn = None
