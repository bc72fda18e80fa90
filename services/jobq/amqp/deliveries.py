"""What a consumer receives from RabbitMQ: a delivered message's body and the
means to settle it, and nothing else.

aio-pika turns every delivery into an ``IncomingMessage`` (each property
decoded, timestamps and expiry converted) and runs the callback in a task of
its own, after aiormq's. A job's message carries only its id, so most of
that was waste (bench/delivery_cost.py: 143 against 106 µs of the consumer
process's CPU a message on this machine, a quarter of it). :class:`LeanQueue`
is aio-pika's robust queue with one change: its consumers get a
:class:`Delivery` straight from aiormq's delivery task (:func:`consume`
starts them, for ``Broker.consume``). Everything robust
stays aio-pika's: the consumer is recorded where the channel restores it
after a reconnect, and where a broker's ``basic.cancel`` of it starts a
recovery.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol, cast

import aiormq
from aio_pika.abc import AbstractQueue, AbstractRobustConnection, ConsumerTag, TimeoutType
from aio_pika.robust_queue import RobustQueue
from aiormq.abc import DeliveredMessage

log = logging.getLogger("jobq.amqp.broker")


class Settleable(Protocol):
    """The part of a delivery the intake uses (the unit tests fake it)."""

    @property
    def body(self) -> bytes: ...

    @property
    def delivery_tag(self) -> int | None: ...

    @property
    def routing_key(self) -> str | None: ...

    @property
    def channel(self) -> Any: ...

    def ack(self, multiple: bool = False) -> Awaitable[Any]: ...

    def nack(self, multiple: bool = False, requeue: bool = True) -> Awaitable[Any]: ...

    def reject(self, requeue: bool = False) -> Awaitable[Any]: ...


class Delivery:
    """One delivered message. Settling it is one frame on the channel it came
    on; ``channel`` raises once that channel is closed, as aio-pika's does
    (RabbitMQ has requeued its unsettled deliveries then)."""

    __slots__ = ("_channel", "body", "delivery_tag", "routing_key")

    def __init__(self, msg: DeliveredMessage) -> None:
        tag = msg.delivery_tag
        if tag is None:  # a consumer is sent basic.deliver only, which always has one
            raise ValueError("not a delivery: no delivery tag")
        self.body: bytes = msg.body
        self.delivery_tag: int = tag
        self.routing_key: str | None = msg.routing_key  # jobq's: the job queue's name
        self._channel: aiormq.abc.AbstractChannel = msg.channel

    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        if self._channel.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError("the delivery's channel is closed")
        return self._channel

    def ack(self, multiple: bool = False) -> Awaitable[Any]:
        return self.channel.basic_ack(delivery_tag=self.delivery_tag, multiple=multiple)

    def nack(self, multiple: bool = False, requeue: bool = True) -> Awaitable[Any]:
        return self.channel.basic_nack(delivery_tag=self.delivery_tag, multiple=multiple,
                                       requeue=requeue)

    def reject(self, requeue: bool = False) -> Awaitable[Any]:
        return self.channel.basic_reject(delivery_tag=self.delivery_tag, requeue=requeue)


async def _deliver(callback: Callable[[Delivery], Any], msg: DeliveredMessage) -> None:
    callback(Delivery(msg))  # runs in aiormq's task for this delivery: no second one


class LeanQueue(RobustQueue):
    """A robust queue whose consumers receive :class:`Delivery` objects (a
    plain function each: called in aiormq's delivery task). :func:`consume`
    sets its channel's ``QUEUE_CLASS`` to it."""

    async def consume(  # type: ignore[override]  # the callback takes a Delivery
        self,
        callback: Callable[[Delivery], Any],
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Any = None,
        consumer_tag: ConsumerTag | None = None,
        timeout: TimeoutType = None,  # noqa: ASYNC109  # aio-pika's signature, passed on
        robust: bool = True,
    ) -> ConsumerTag:
        # aio-pika's Queue.consume and RobustQueue.consume in one, with
        # _deliver in place of aio-pika's IncomingMessage wrapper.
        channel = await self.channel.get_underlay_channel()
        ok = await channel.basic_consume(
            queue=self.name, consumer_callback=partial(_deliver, callback),
            exclusive=exclusive, no_ack=no_ack, arguments=arguments,
            consumer_tag=consumer_tag, timeout=timeout)
        if ok.consumer_tag is None:
            raise RuntimeError("the broker returned no consumer tag")
        if robust:  # what the channel's restore and its consumer-cancel hook read
            self._consumers[ok.consumer_tag] = {
                "callback": callback, "no_ack": no_ack, "exclusive": exclusive,
                "arguments": arguments}
        return ok.consumer_tag


async def consume(conn: AbstractRobustConnection,
                  queues: list[tuple[str, dict[str, str] | None]],
                  on_message: Callable[[Delivery], Any],
                  prefetch: int) -> Callable[[], Awaitable[None]]:
    """Consume these declared queues (name, declare arguments; None: only
    look the queue up) on a channel of their own; returns a coroutine function
    that stops intake."""
    ch = await conn.channel()
    ch.QUEUE_CLASS = LeanQueue  # this channel's queues hand out Delivery objects
    tags: list[tuple[AbstractQueue, str]] = []
    try:
        await ch.set_qos(prefetch_count=prefetch)
        for name, args in queues:
            q = (await ch.get_queue(name) if args is None else
                 await ch.declare_queue(name, durable=True, arguments=args))
            tags.append((q, await cast(LeanQueue, q).consume(on_message)))
    except BaseException:
        # A robust channel would come back with the consumers it had, beside
        # the next attempt's (start_when_possible): none may outlive this one.
        with contextlib.suppress(Exception):
            await ch.close()
        raise

    async def stop() -> None:
        for q, tag in tags:
            try:
                await q.cancel(tag)
            except Exception as exc:  # broker gone: nothing more will arrive anyway
                log.debug("cancel consumer %s: %r", tag, exc)

    return stop
