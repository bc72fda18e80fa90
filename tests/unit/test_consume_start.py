"""A consumer's first basic.consume waits out what can heal (issue #36).

Found by bench/nemesis.py (seed 302): a consumer starting while RabbitMQ was
deleting the previous run's quorum queues got its connection closed with
INTERNAL_ERROR at its first basic.consume and exited with a traceback, where
every other broker error at start-up is waited out. start_when_possible is
what the consumer now calls; these tests feed it the broker's real exception
types."""

from __future__ import annotations

import asyncio

import aiormq
import pytest

from jobq.amqp.connect import start_when_possible


def test_a_closed_connection_at_the_first_consume_is_retried_until_it_works() -> None:
    calls = []

    async def start() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise aiormq.exceptions.ConnectionInternalError("INTERNAL_ERROR")
        return "consuming"

    assert asyncio.run(start_when_possible(start, asyncio.Event())) == "consuming"
    assert len(calls) == 3


def test_a_refused_queue_is_not_retried() -> None:
    async def start() -> str:
        raise aiormq.exceptions.ChannelAccessRefused("no configure permission")

    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        asyncio.run(start_when_possible(start, asyncio.Event()))


def test_a_stop_while_the_broker_refuses_ends_the_wait() -> None:
    async def go() -> str | None:
        stopped = asyncio.Event()

        async def start() -> str:
            stopped.set()  # SIGTERM while the broker is still away
            raise aiormq.exceptions.ConnectionInternalError("INTERNAL_ERROR")

        return await asyncio.wait_for(start_when_possible(start, stopped), 5)

    assert asyncio.run(go()) is None
