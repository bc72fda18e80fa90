"""Why a delivered id could not be claimed, said once per id and counted:
an unknown job, one of a queue this worker does not handle, one held back
by a limit (parked), one not due yet, one past its deadline (expired), or a
duplicate delivery. The intake
acks and drops each: the row, not the message, is the truth. And a body
whose lines are not all job ids (malformed), said when it is delivered."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from jobq.status import Status
from jobq.telemetry.logs import fields
from jobq.worker.tally import Tally

if TYPE_CHECKING:
    from jobq.worker.acks import Envelope
    from jobq.worker.store import WorkerStore

log = logging.getLogger("jobq.consumer")


async def explain_misses(store: WorkerStore, tally: Tally, queues: list[str],
                         ids: list[uuid.UUID]) -> None:
    found = await store.claim_misses(ids)
    for i in ids:
        row = found.get(i)
        if row is None:
            tally.drop("unknown_job")
            log.warning("message for unknown job id; dropped",
                        extra=fields(event="unknown_job", job=i))
        elif row.status == Status.QUEUED and row.queue not in queues:
            tally.drop("foreign_queue")
            log.warning("job belongs to queue %s, which this worker does not handle; "
                        "dropped (its own queue's message, or the relay, brings it)",
                        row.queue,
                        extra=fields(event="foreign_queue", job=i, queue=row.queue))
        elif row.status == Status.QUEUED and row.expired:
            tally.drop("expired")
            log.info("job not started by its deadline (expires_in_s); dropped, never run "
                     "(the reapers cancel it: expired)",
                     extra=fields(event="expired", job=i, queue=row.queue))
        elif row.status == Status.QUEUED and row.parked:
            tally.note("limited")
            log.info("held back by its queue's limit (max_running / rate_per_s): parked; "
                     "the reapers publish it again when a slot frees",
                     extra=fields(event="limited", job=i, queue=row.queue))
        elif row.status == Status.QUEUED and row.not_due:
            tally.drop("not_due")
            log.info("early delivery for a job not due yet; dropped (the relay "
                     "publishes it when due)", extra=fields(event="not_due", job=i))
        else:
            tally.drop("duplicate")
            log.info("duplicate delivery: job is %s; dropped", row.status,
                     extra=fields(event="duplicate", job=i, status=row.status))


def tell_malformed(tally: Tally, env: Envelope) -> None:
    """Count a body's lines that are not ids; say so, rate-limited."""
    tally.drop("malformed", env.bad)
    n = tally.counters["malformed"]
    if n <= 10 or n % 1000 < env.bad:
        what = "body is not a job id" if not env.ids else \
            f"{env.bad} line(s) of the body are not job ids (its {len(env.ids)} ids run)"
        log.warning("malformed message: %s; dead-lettered (%d so far)", what, n,
                    extra=fields(event="malformed", body=repr(env.msg.body[:80])))
