"""Opening a connection to RabbitMQ, and what each of its errors means.

A service waits out what can heal (the broker not up yet, the network) with
a backoff, and stops at once with one line for what cannot (refused
credentials, a vhost it may not use, a certificate that does not verify).
Every aio-pika / aiormq error is one of three kinds (the database's are in
db.py; db.is_transient answers for both through the jobq error tree):

- configuration, never retried: refused credentials
  (ProbableAuthenticationError) or vhost (Connection.Close instead of OpenOk,
  an InvalidFrameError at connect): ConfigError, the service exits 2;
- one queue refused (ChannelClosed and its kind: precondition failed, access
  refused, not found, locked): only that queue's ids wait; the channel was
  private to that declare;
- transient, everything else: the network, a broker restart, a closed
  channel or connection (aio-pika reconnects), a timeout, an unroutable
  publish (the queue is declared again next time). Retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import aio_pika
import aiormq
from aio_pika.abc import AbstractRobustConnection

from jobq.db import certificate_refused
from jobq.endpoints import FailoverConnection, redact
from jobq.errors import BrokerUnavailable, ConfigError
from jobq.runtime.backoff import Backoff

log = logging.getLogger("jobq.amqp.broker")
T = TypeVar("T")

QUEUE_REFUSED: tuple[type[BaseException], ...] = (aiormq.exceptions.ChannelClosed,)
TRANSIENT: tuple[type[BaseException], ...] = (
    TimeoutError, OSError, RuntimeError,  # aiormq's ChannelInvalidStateError is a RuntimeError
    aiormq.exceptions.AMQPError, aio_pika.exceptions.AMQPError,
)


async def _close_quietly(conn: AbstractRobustConnection) -> None:
    try:
        await conn.close()
    except Exception:  # it never opened: nothing else to do
        pass


async def open_connection(urls: Sequence[str], *, wait: bool) -> AbstractRobustConnection:
    """A robust connection to the first live broker of ``urls`` (aio-pika
    reconnects it and restores its consumers later). ``wait``: retry while
    no broker answers; otherwise raise BrokerUnavailable at once."""
    shown = redact(",".join(urls))
    backoff = Backoff(0.5, 5.0)
    while True:
        try:
            conn = FailoverConnection(list(urls))
            try:
                await conn.connect(timeout=10)
            except BaseException:
                await _close_quietly(conn)  # its half-open sockets, now, not at GC
                raise
            return conn
        except aiormq.exceptions.ProbableAuthenticationError as exc:
            raise ConfigError(
                f"RabbitMQ at {shown} refused the credentials: check JOBQ_AMQP_URL"
            ) from exc
        except aiormq.exceptions.InvalidFrameError as exc:
            # Connection.Close instead of OpenOk: the vhost does not exist
            # or the user may not use it. Retrying cannot heal that.
            if "Connection.Close" not in str(exc):
                raise
            raise ConfigError(
                f"RabbitMQ at {shown} refused to open the vhost: check that it "
                "exists and that the user may use it (JOBQ_AMQP_URL)") from exc
        except TRANSIENT as exc:
            if (why := certificate_refused(exc)) is not None:
                raise ConfigError(
                    f"RabbitMQ's TLS certificate at {shown} was refused ({why}): "
                    "check cafile and the host name in JOBQ_AMQP_URL") from exc
            if not wait:
                raise BrokerUnavailable(
                    f"cannot reach RabbitMQ at {shown} ({type(exc).__name__}: "
                    f"{exc}); is it running? set JOBQ_AMQP_URL"
                ) from exc
            delay = backoff.next()
            log.warning("broker not ready at %s: %s; retrying in %.1fs", shown, exc, delay)
            await asyncio.sleep(delay)


async def start_when_possible(start: Callable[[], Awaitable[T]],
                              stopped: asyncio.Event) -> T | None:
    """``start()`` (a consumer's first basic.consume), waiting out what can
    heal: a broker restarting or busy deleting queues under it closes the
    connection (INTERNAL_ERROR; aio-pika reconnects), and a service must not
    exit for that (bench/nemesis.py, seed 302). None if ``stopped`` first. A
    refused queue (ChannelClosed: access, not found) is raised, as before."""
    backoff = Backoff(0.5, 5.0)
    while True:
        try:
            return await start()
        except QUEUE_REFUSED:
            raise
        except TRANSIENT as exc:
            delay = backoff.next()
            log.warning("could not start consuming (%s: %s); retrying in %.1fs",
                        type(exc).__name__, exc, delay)
            try:
                await asyncio.wait_for(stopped.wait(), delay)
                return None
            except TimeoutError:
                pass
