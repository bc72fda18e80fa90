"""How a run of deliveries is settled: one frame per channel where it can be.

A batch is acked (or nacked with requeue) with ``multiple=True`` on its
highest delivery tag, which settles every lower tag of that channel too —
so only when no delivery still unsettled has a lower tag there: none waits
in the inbox, none is in a batch whose claim is being retried aside.
Otherwise one by one. Tags are per channel, and a channel may change between
deliveries (a reconnect); deliveries of a closed channel are skipped:
RabbitMQ requeued them already. *What* to settle is the intake's ack policy
(``intake.py``); this is only *how*.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterable
from typing import Any

import aiormq

from jobq.amqp.deliveries import Settleable

log = logging.getLogger("jobq.consumer")

SETTLE_TIMEOUT_S = 5.0


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
    def __init__(self, inbox: collections.deque[Settleable]) -> None:
        self._inbox = inbox  # deliveries not taken yet
        self._unsettled: set[Settleable] = set()  # taken, not yet settled

    def taken(self, msgs: Iterable[Settleable]) -> None:
        self._unsettled.update(msgs)

    async def settle(self, msgs: list[Settleable], ack: bool) -> None:
        self._unsettled.difference_update(msgs)
        by_channel: dict[Any, list[Settleable]] = {}
        for m in msgs:
            ch = _channel_of(m)
            if ch is not None:
                by_channel.setdefault(ch, []).append(m)
        for ch, ms in by_channel.items():
            top = max(ms, key=lambda m: m.delivery_tag or 0)
            tag = top.delivery_tag or 0
            multiple = len(ms) > 1 and not any(
                _channel_of(m) is ch and (m.delivery_tag or 0) < tag
                for pending in (self._inbox, self._unsettled) for m in pending)
            for m in ([top] if multiple else ms):
                await settle_one(m.ack(multiple=multiple) if ack
                                 else m.nack(multiple=multiple, requeue=True))
