"""What a message body is: one job id as text, or several, one per line.

A batch a producer publishes (``publish_many``, concurrent publishes of one
client) goes to the broker as few messages as it takes, up to
:data:`PACK_MAX` ids each, in the order given; ids going back in line (a
relay sweep, a consumer's releases) are spread (:func:`spread`). One message for many
jobs is one publish, one confirm, one queue entry RabbitMQ writes and
replicates, one delivery and one ack: the broker's work per job, and the
consumer's AMQP frames, shrink by the batch's size (bench/README.md, #49).

Any AMQP client still reads it: split the body on newlines, each line an id.
A single id is the body it always was (no newline), so a producer in another
language that publishes one id per message needs no change.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

PACK_MAX = 100  # ids per message a publisher packs at most
SPREAD = 16  # a queue's ids going back in line: at least this many messages where it can
UNPACK_MAX = 10_000  # lines a consumer reads from one body; longer: malformed
_LINE = 36  # an id's text


def pack(ids: Sequence[uuid.UUID], per: int = PACK_MAX
         ) -> Iterator[tuple[list[uuid.UUID], bytes]]:
    """The messages for ``ids``, ``per`` ids each at most: (their ids, body),
    order kept."""
    for k in range(0, len(ids), per):
        chunk = list(ids[k:k + per])
        yield chunk, "\n".join(map(str, chunk)).encode()


def spread(n: int) -> int:
    """Ids per message for a batch of ``n`` going back in line: a lapsed
    consumer's jobs (requeued and relayed together), a draining consumer's
    releases should start on the whole fleet at once, not queue on the one
    consumer a single message reaches. So at least :data:`SPREAD` messages
    where ``n`` allows (up to 16 ids: one each); a bulk backlog relayed is
    still packed, ``n / 16`` to a message."""
    return max(1, min(PACK_MAX, -(-n // SPREAD)))


def unpack(body: bytes) -> tuple[list[uuid.UUID], int]:
    """The ids a body carries, in order, and how many of its lines are not
    ids (blank lines and a trailing newline are not counted)."""
    if len(body) > UNPACK_MAX * (_LINE + 2):  # do not even decode junk
        return [], 1
    ids: list[uuid.UUID] = []
    bad = 0
    for line in body.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        try:
            ids.append(uuid.UUID(line.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            bad += 1
    if not ids and not bad:
        bad = 1  # an empty body is not an id either
    return ids, bad
