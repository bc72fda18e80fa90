"""How deliveries are settled: each message once, when the last id it
carries is done, and one frame per channel where it can be.

A message may carry several ids (amqp/bodies.py). Its :class:`Envelope`
counts the ids not yet taken from the inbox and those taken but not yet
settled; the message is settled when both are none: acked if every id was
claimed or dropped, nacked with requeue if any was given back (RabbitMQ
redelivers it, and the ids already claimed are dropped then as duplicates:
the row is the truth), rejected to the dead-letter queue if some of its
lines were not ids.

Acks go out with ``multiple=True`` on the highest delivery tag, which
settles every lower tag of that channel too — so only when no message still
unsettled has a lower tag there: none waits in the inbox, none has an id in
a batch whose claim is being retried aside. Otherwise one by one. Tags are
per channel, and a channel may change between deliveries (a reconnect);
messages of a closed channel are skipped: RabbitMQ requeued them already.
*What* to settle is the intake's ack policy (``intake.py``); this is only
*how*.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

import aiormq

from jobq.amqp.bodies import unpack
from jobq.amqp.deliveries import Settleable

log = logging.getLogger("jobq.consumer")

SETTLE_TIMEOUT_S = 5.0


class Envelope:
    """One delivered message and the ids it carries, in order."""

    __slots__ = ("arrived", "bad", "ids", "msg", "open", "requeue", "taken")

    def __init__(self, msg: Settleable) -> None:
        self.msg = msg
        self.ids: list[uuid.UUID]
        self.ids, self.bad = unpack(msg.body)  # bad: lines that are not ids
        self.taken = 0  # ids handed to a batch so far (ids[:taken])
        self.open = 0  # taken ids whose batch has not settled them yet
        self.requeue = False  # an id was given back: the message goes back
        self.arrived = time.monotonic()  # held too long: handback.py

    @property
    def waiting(self) -> int:
        return len(self.ids) - self.taken


def _channel_of(msg: Settleable) -> Any:
    """The channel a delivery came on, or None once that channel is closed."""
    try:
        return msg.channel
    except aiormq.exceptions.ChannelInvalidStateError:
        return None


async def settle_one(op: Any) -> None:
    # The channel may be gone (broker restart): RabbitMQ then redelivers the
    # message itself, and the redelivered id's claim fails and is dropped.
    # Bounded: on a channel that died mid-flight an ack can hang.
    try:
        await asyncio.wait_for(op, SETTLE_TIMEOUT_S)
    except Exception as exc:
        log.debug("ack/nack failed: %r", exc)


class Acks:
    def __init__(self, inbox: collections.deque[Envelope]) -> None:
        self._inbox = inbox  # messages with ids not taken yet
        self._unsettled: set[Envelope] = set()  # ids taken, message not settled

    def taken(self, parts: Iterable[Envelope]) -> None:
        """Ids of these envelopes (one entry per id) went into a batch."""
        for env in parts:
            env.open += 1
            self._unsettled.add(env)

    async def settle(self, parts: list[Envelope], ack: bool) -> None:
        """Ids of a batch are done (one entry per id): claimed or dropped
        (``ack``), or given back; settle the messages they finish."""
        done: dict[Envelope, None] = {}  # ordered, each once
        for env in parts:
            env.open -= 1
            env.requeue |= not ack
            if env.open == 0 and env.waiting == 0:
                done[env] = None
        await self._settle(list(done))

    async def finish(self, env: Envelope, requeue: bool) -> None:
        """The ids still waiting in ``env`` are dealt with otherwise (given
        back with the message if ``requeue``; published again on their own
        if not): settle it now, or when its last taken id is done."""
        env.taken = len(env.ids)
        env.requeue |= requeue
        if env.open == 0:
            await self._settle([env])
        else:
            self._unsettled.add(env)

    async def _settle(self, envs: list[Envelope]) -> None:
        self._unsettled.difference_update(envs)
        acks: dict[Any, list[Settleable]] = {}
        for env in envs:
            ch = _channel_of(env.msg)
            if ch is None:
                continue
            if env.requeue:
                await settle_one(env.msg.nack(requeue=True))
            elif env.bad:  # its valid ids are done; the message is kept for a look
                await settle_one(env.msg.reject(requeue=False))
            else:
                acks.setdefault(ch, []).append(env.msg)
        for ch, ms in acks.items():
            top = max(ms, key=lambda m: m.delivery_tag or 0)
            tag = top.delivery_tag or 0
            multiple = len(ms) > 1 and not any(
                _channel_of(e.msg) is ch and (e.msg.delivery_tag or 0) < tag
                for pending in (self._inbox, self._unsettled) for e in pending)
            for m in ([top] if multiple else ms):
                await settle_one(m.ack(multiple=multiple))
