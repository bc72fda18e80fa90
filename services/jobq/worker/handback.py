"""Ids a busy consumer holds are handed back, one message each.

A message may carry up to a hundred ids (amqp/bodies.py), and a consumer
takes one slot per id. While its jobs end quickly, the ids it holds start
within milliseconds and packing costs nothing. When no slot has freed for
:data:`HOLD_S` (long jobs), or a message waiting for a slot arrived more
than :data:`AGE_S` ago (a burst of jobs of a second or so, which one
consumer would run a slotful at a time while others idle), the ids still
waiting in its inbox are published again as one message per id: the fleet
then shares them as it shares single publishes, each consumer holding at
most its prefetch. Their message is acked once every id it carries is
claimed or republished.

Crash-safe as every other path: the republish is confirmed before the ack,
so dying between them redelivers the message, and each id then claimed
twice is claimed once (the row is the truth; the duplicate is dropped).
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from jobq.telemetry.logs import fields
from jobq.worker.acks import Acks, Envelope
from jobq.worker.tally import Tally

log = logging.getLogger("jobq.consumer")

HOLD_S = 0.5  # no slot freed this long: the held ids go back to the fleet
AGE_S = 2.0  # or the oldest waiting message arrived this long ago

Publish = Callable[[list[uuid.UUID], str], Awaitable[set[uuid.UUID]]]


class HandBack:
    """When the intake, waiting for a slot, gives up on it and hands back."""

    def __init__(self, publish: Publish, queues: list[str], tally: Tally) -> None:
        self._publish, self._queues, self._tally = publish, queues, tally
        self._next = 0.0  # monotonic: no try before (one each HOLD_S at most)

    def patience(self, inbox: collections.deque[Envelope]) -> float | None:
        """How long to wait for a slot before handing back; None: nothing to
        hand back (no message in the inbox holds more than one waiting id of
        a queue this consumer knows by name)."""
        if not any(e.waiting > 1 and e.msg.routing_key in self._queues for e in inbox):
            return None
        now = time.monotonic()
        return max(0.0, min(HOLD_S, inbox[0].arrived + AGE_S - now), self._next - now)

    async def give(self, inbox: collections.deque[Envelope], acks: Acks) -> None:
        """Publish the waiting ids of the inbox's packed messages one message
        each; what the broker confirmed leaves the inbox. Whatever comes of
        it, the next try is HOLD_S away: a broker that confirms nothing must
        not turn the wait for a slot into a spin."""
        self._next = time.monotonic() + HOLD_S
        for env in [e for e in inbox if e.waiting > 1 and e.msg.routing_key in self._queues]:
            rest, queue = env.ids[env.taken:], str(env.msg.routing_key)
            try:
                confirmed = await self._publish(rest, queue)
            except Exception as exc:  # kept, and tried again
                log.warning("could not hand back held ids: %r", exc)
                return
            if not confirmed:
                return  # kept, and tried again
            self._tally.handed_back(queue, len(confirmed))
            log.info("handed %d held ids back to the fleet (no slot here)", len(confirmed),
                     extra=fields(event="handed_back", queue=queue, ids=len(confirmed)))
            left = [i for i in rest if i not in confirmed]
            env.ids[env.taken:] = left
            if not left:
                inbox.remove(env)
                await acks.finish(env, requeue=False)
