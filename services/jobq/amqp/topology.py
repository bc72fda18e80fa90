"""Declaring the broker topology once, for services that may not (issue #14).

With least privilege, only the migrate step's RabbitMQ user has configure
permission; consumers, reapers and producers only check that the exchange and
their queues exist (broker.py). ``jobq declare`` (or ``jobq migrate
--declare``) declares jobq's exchange, dead-letter exchange and queue, and
the durable queue of every job queue in ``jobq.queue`` plus any named on the
command line, with the same arguments the services would use. Run it again
after adding a queue (``jobq queue set NEW``): a runtime user cannot create
one, and ids for it wait in PostgreSQL (the relay retries) until it exists.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobq.amqp.broker import Broker
from jobq.db import open_pool
from jobq.errors import ConfigError
from jobq.ops.admin import list_queues
from jobq.settings import Settings


async def declare(settings: Settings, extra: Sequence[str] = ()) -> list[str]:
    """Declare everything; returns the job queues declared."""
    pool = await open_pool(settings.database_url, wait=False, app_name="jobq-declare",
                           pooled=settings.database_pooled)
    try:
        names = [r["name"] for r in await list_queues(pool)]
    finally:
        await pool.close()
    queues = sorted(set(names) | set(extra))
    broker = Broker(settings.amqp_url, settings.namespace, settings.amqp_heartbeat_s)
    await broker.connect(wait=False)
    try:
        if not broker.may_configure:
            raise ConfigError(
                "the RabbitMQ user of JOBQ_AMQP_URL may not declare queues: run `jobq declare` "
                f"as a user with configure permission on '^{settings.namespace}(\\.|$)'")
        for queue in queues:
            await broker.ensure_queue(queue)
    finally:
        await broker.close()
    return queues
