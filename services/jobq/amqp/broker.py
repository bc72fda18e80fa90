"""RabbitMQ: topology, publishing ids with confirms, deliveries.

Knows nothing of leases or job rows. The wire format is the contract:

- one durable direct exchange named ``<namespace>`` (default ``jobq``);
- one durable queue per job queue, ``<namespace>.<queue>``, bound with the
  queue name as routing key; quorum queues (classic durable queues where the
  broker has no quorum support);
- rejected (malformed) messages dead-letter to ``<namespace>.dead``;
- body = the job id as text, or several ids one per line (bodies.py: a
  batch published together), persistent delivery, publisher confirms,
  ``mandatory`` so an unroutable id is an error, not a silent drop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractRobustConnection,
)

from jobq.amqp.bodies import pack as pack_ids
from jobq.amqp.bodies import spread
from jobq.amqp.connect import QUEUE_REFUSED, TRANSIENT, open_connection
from jobq.amqp.deliveries import Delivery, consume
from jobq.endpoints import redact, split_amqp, with_heartbeat
from jobq.errors import BrokerUnavailable, ConfigError

log = logging.getLogger("jobq.amqp.broker")

PUBLISH_TIMEOUT_S = 10.0


def queue_arguments(namespace: str) -> dict[str, str]:
    """Declare arguments of a job queue (deploy/rabbitmq/definitions.json matches)."""
    return {"x-queue-type": "quorum", "x-dead-letter-exchange": f"{namespace}.dlx"}


async def _outcome(send: Awaitable[None]) -> BaseException | None:
    """One send's result as gather(return_exceptions=True) gives it."""
    try:
        await send
    except Exception as exc:
        return exc
    return None


class Broker:
    def __init__(self, url: str, namespace: str, heartbeat_s: int = 5) -> None:
        self.urls = [with_heartbeat(u, heartbeat_s) for u in split_amqp(url)]
        self.namespace = namespace
        self._conn: AbstractRobustConnection | None = None
        self._pub: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._declared: dict[str, dict[str, str] | None] = {}  # queue -> declare arguments
        self.may_configure = True  # False: a user without configure permission (checks only)
        self._declare_lock = asyncio.Lock()
        self._closing = False

    def queue_name(self, queue: str) -> str:
        return f"{self.namespace}.{queue}"

    # ── connection ──

    async def connect(self, *, wait: bool) -> None:
        """Connect (robustly: aio-pika reconnects and restores consumers)."""
        self._conn = await open_connection(self.urls, wait=wait)
        self._conn.close_callbacks.add(self._on_close)
        self._conn.reconnect_callbacks.add(self._on_reconnect)
        await self._declare_topology()
        self._pub = await self._conn.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await self._pub.get_exchange(self.namespace, ensure=False)

    async def _declare_topology(self) -> None:
        """The exchange, the dead-letter exchange and queue. A user without
        configure permission still runs where they exist (declared by another
        service or an administrator): then they are only checked."""
        assert self._conn is not None
        ns = self.namespace
        ch = await self._conn.channel()
        try:
            await ch.declare_exchange(ns, aio_pika.ExchangeType.DIRECT, durable=True)
            dlx = await ch.declare_exchange(f"{ns}.dlx", aio_pika.ExchangeType.FANOUT,
                                            durable=True)
            dead = await ch.declare_queue(f"{ns}.dead", durable=True)
            await dead.bind(dlx)
            await ch.close()
            self.may_configure = True
            return
        except aiormq.exceptions.ChannelAccessRefused:
            self.may_configure = False
        ch = await self._conn.channel()
        try:
            await ch.get_exchange(ns)
            await ch.get_exchange(f"{ns}.dlx")
            await ch.get_queue(f"{ns}.dead")
            await ch.close()
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise ConfigError(
                f"the RabbitMQ user of JOBQ_AMQP_URL may not declare jobq's exchange {ns!r} "
                "and it does not exist yet: start one service with a user that may, or grant "
                f"configure permission on '^{ns}(\\.|$)'") from exc

    def _on_close(self, _conn: object, exc: BaseException | None = None) -> None:
        if exc is not None and not isinstance(exc, asyncio.CancelledError) and not self._closing:
            log.warning("broker connection lost (%r); reconnecting", exc)

    def _on_reconnect(self, conn: object) -> None:
        log.info("broker connection re-established at %s", redact(str(getattr(conn, "url", ""))))

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed

    async def close(self) -> None:
        self._closing = True
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    # ── topology ──

    async def ensure_queue(self, queue: str) -> dict[str, str] | None:
        """Declare the durable queue for a job queue (once per process).

        Returns the arguments it was declared with, for other channels; None
        when this user may not declare and the queue was found to exist.
        """
        if queue in self._declared:
            return self._declared[queue]
        async with self._declare_lock:
            if queue in self._declared:
                return self._declared[queue]
            assert self._conn is not None and self._exchange is not None
            name = self.queue_name(queue)
            if not self.may_configure:
                ch = await self._conn.channel()
                await ch.get_queue(name)  # ChannelNotFoundEntity: refused, per queue
                await ch.close()
                self._declared[queue] = None
                return None
            args = queue_arguments(self.namespace)
            ch = await self._conn.channel()
            try:
                q = await ch.declare_queue(name, durable=True, arguments=args)
            except aiormq.exceptions.ChannelClosed as exc:
                # Exists as a classic queue, or no quorum support: classic it is.
                log.info("queue %s: quorum declare refused (%s); using a classic queue", name, exc)
                args = {"x-dead-letter-exchange": f"{self.namespace}.dlx"}
                ch = await self._conn.channel()
                q = await ch.declare_queue(name, durable=True, arguments=args)
            await q.bind(self._exchange, routing_key=queue)
            await ch.close()
            self._declared[queue] = args
            return args

    # ── publish ──

    async def publish(self, items: Iterable[tuple[uuid.UUID, str]],
                      per_message: int | None = None) -> set[uuid.UUID]:
        """Publish ids; return the ids the broker confirmed.

        Ids of one queue go out packed, up to ``per_message`` in a message,
        in order (amqp/bodies.py); by default spread by each queue's own
        count: ids going back in line (a relay sweep, a drain's releases)
        should reach that queue's whole fleet; a producer's batch is packed
        full (client/publisher.py). Ids that failed are left out (logged);
        their rows stay unpublished, for the relay. Never raises for a single
        failed message; raises BrokerUnavailable if nothing could be sent."""
        items = list(items)
        if not items:
            return set()
        if self._exchange is None:
            raise BrokerUnavailable("not connected to RabbitMQ")
        exchange = self._exchange.name  # read before any await, as the channel below
        items = await self._declared_only(items)
        if not items:
            return set()
        channel = await self._underlay()
        by_queue: dict[str, list[uuid.UUID]] = {}
        for job_id, queue in items:
            by_queue.setdefault(queue, []).append(job_id)
        messages = [(chunk, body, queue) for queue, ids in by_queue.items()
                    for chunk, body in pack_ids(ids, per_message or spread(len(ids)))]
        sends = [self._send(channel, exchange, body, queue) for _, body, queue in messages]
        # One message (a single publish, the common call) is awaited in this
        # task: gather would start a task for it.
        results = ([await _outcome(sends[0])] if len(sends) == 1 else
                   await asyncio.gather(*sends, return_exceptions=True))
        confirmed: set[uuid.UUID] = set()
        errors = []
        for (chunk, _, _), res in zip(messages, results):
            if isinstance(res, BaseException):
                errors.append(res)
            else:
                confirmed.update(chunk)
        if errors:
            log.warning("%d of %d messages (%d ids) not confirmed by the broker (%r); the "
                        "reaper will republish them", len(errors), len(messages),
                        len(items) - len(confirmed), errors[0])
        if not confirmed and errors:
            raise BrokerUnavailable(f"publish failed: {errors[0]!r}") from errors[0]
        return confirmed

    async def _declared_only(self, items: list[tuple[uuid.UUID, str]]
                             ) -> list[tuple[uuid.UUID, str]]:
        """The items whose queue is declared. Queue by queue: one that cannot
        be declared (a name taken by another kind of queue, a permission)
        leaves only its own ids unpublished, never the others of the batch."""
        refused: dict[str, BaseException] = {}
        for queue in sorted({q for _, q in items}):
            try:
                await self.ensure_queue(queue)
            except QUEUE_REFUSED as exc:  # this queue only: its channel closed, not ours
                refused[queue] = exc
            except TRANSIENT as exc:  # the broker or the connection is away: all of them
                raise BrokerUnavailable(f"cannot declare queue {queue}: {exc!r}") from exc
        if refused:
            first, why = next(iter(refused.items()))
            log.warning("cannot declare %d queue(s) (%s: %r); their ids stay unpublished",
                        len(refused), first, why)
            items = [(i, q) for i, q in items if q not in refused]
        return items

    async def _underlay(self) -> aiormq.Channel:
        """The publishing channel's aiormq channel. As Exchange.publish: a
        closed channel fails at once (the robust channel's
        get_underlay_channel waits for a reconnect: bounded here, the caller
        is not held; the relay is the fallback, not a wait)."""
        pub = self._pub
        assert pub is not None  # set with the exchange
        try:
            if pub.is_closed:
                raise aiormq.exceptions.ChannelInvalidStateError(f"{pub!r} closed")
            # the concrete channel: the abstract one does not declare ``wait``
            if self._conn is not None and self._conn.connected.is_set():
                # returns at once: no wait_for (a task per publish) needed
                return cast(aiormq.Channel, await pub.get_underlay_channel())
            return cast(aiormq.Channel, await asyncio.wait_for(
                pub.get_underlay_channel(), PUBLISH_TIMEOUT_S))
        except TRANSIENT as exc:  # TimeoutError among them
            raise BrokerUnavailable(f"publish failed: {exc!r}") from exc

    async def _send(self, channel: aiormq.Channel, exchange: str, body: bytes,
                    queue: str) -> None:
        """aiormq's own publish, as aio-pika's Exchange.publish makes it
        (persistent, mandatory, confirmed, timed out), but wait=False: the
        channel lock is released once the frames are queued, not after the
        writer task has sent them. Publishes of one batch no longer take turns
        per write; each still awaits its confirm (bench/publish_path.py
        measures both ways raw: broker_limit)."""
        try:
            await channel.basic_publish(
                body, exchange=exchange, routing_key=queue,
                properties=aiormq.spec.Basic.Properties(
                    content_type="text/plain", delivery_mode=2,
                    message_id=body[:36].decode()),  # the (first) id
                mandatory=True, timeout=PUBLISH_TIMEOUT_S, wait=False)
        except aiormq.exceptions.PublishError:
            # Unroutable: the queue vanished (deleted, or lost by the
            # broker). Declare it again on the next attempt.
            self._declared.pop(queue, None)
            raise

    async def ready_count(self, queue: str) -> int:
        """Messages ready in a job queue (0 if the queue does not exist)."""
        assert self._conn is not None
        ch = await self._conn.channel()
        try:
            q = await ch.declare_queue(self.queue_name(queue), passive=True)
            return int(q.declaration_result.message_count or 0)
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._declared.pop(queue, None)
            return 0
        finally:
            if not ch.is_closed:
                await ch.close()

    # ── consume ──

    async def consume(
        self,
        queues: Iterable[str],
        on_message: Callable[[Delivery], Any],
        prefetch: int,
    ) -> Callable[[], Awaitable[None]]:
        """Start consuming; returns a coroutine function that stops intake."""
        assert self._conn is not None
        declared = [(self.queue_name(q), await self.ensure_queue(q)) for q in queues]
        return await consume(self._conn, declared, on_message, prefetch)
