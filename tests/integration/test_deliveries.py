"""A consumer's deliveries (deliveries.py): lean objects straight from
aiormq, settled on the channel they came on, and the same path again after
the connection is cut and aio-pika's robust channel restores the consumer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import aiormq
import pytest

from harness.helpers import TcpProxy
from jobq.amqp.broker import Broker
from jobq.amqp.deliveries import Delivery
from jobq.settings import Settings


@pytest.fixture
def mq_proxy(settings: Settings) -> Iterator[TcpProxy]:
    u = urlsplit(settings.amqp_url)
    proxy = TcpProxy(u.hostname or "127.0.0.1", u.port or 5672)
    proxy.restore()
    yield proxy
    proxy.close()


def test_deliveries_are_lean_and_come_back_the_same_after_a_cut(settings: Settings,
                                                                 mq_proxy: TcpProxy) -> None:
    async def go() -> None:
        consumer = Broker(mq_proxy.url(settings.amqp_url), settings.namespace, heartbeat_s=2)
        publisher = Broker(settings.amqp_url, settings.namespace)
        await consumer.connect(wait=True)
        await publisher.connect(wait=True)
        got: asyncio.Queue[Delivery] = asyncio.Queue()
        try:
            stop = await consumer.consume(["lean"], got.put_nowait, prefetch=8)
            first = uuid.uuid4()
            assert await publisher.publish([(first, "lean")]) == {first}
            d = await asyncio.wait_for(got.get(), 10)
            assert type(d) is Delivery, f"aio-pika's wrapper came back: {type(d)}"
            assert d.body == str(first).encode()
            await d.ack()
            await d.channel.basic_qos(prefetch_count=8)  # a round trip: the ack is in

            mq_proxy.cut()
            # The cut channel is closed: settling on it must say so (the
            # intake skips such deliveries: RabbitMQ requeued them already).
            for _ in range(100):
                if d._channel.is_closed:
                    break
                await asyncio.sleep(0.1)
            with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
                d.channel  # noqa: B018  # the property raises
            mq_proxy.restore()

            second = uuid.uuid4()
            assert await publisher.publish([(second, "lean")]) == {second}
            again = await asyncio.wait_for(got.get(), 30)  # after the robust restore
            assert type(again) is Delivery
            assert again.body == str(second).encode(), "the acked id came back"
            await again.ack()
            await again.channel.basic_qos(prefetch_count=8)
            await stop()
            assert got.empty()
            assert await publisher.ready_count("lean") == 0
        finally:
            await consumer.close()
            await publisher.close()
            # No jobq.queue row names it, so the namespace fixture would leave it.
            conn = await aiormq.connect(settings.amqp_url)
            await (await conn.channel()).queue_delete(f"{settings.namespace}.lean")
            await conn.close()

    asyncio.run(go())
