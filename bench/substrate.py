"""The substrate limit: exactly jobq's per-job work with no framework, one
job at a time, on the same PostgreSQL and RabbitMQ:

  produce: INSERT the row, publish the id (persistent, publisher confirm)
  consume: receive, conditional UPDATE claim, ack, guarded UPDATE complete

    python bench/substrate.py DB_URL AMQP_URL N   -> JSON {publish_per_s, drain_per_s}
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

import aio_pika
import asyncpg

DDL = """
CREATE TABLE IF NOT EXISTS substrate_job (
    id uuid PRIMARY KEY, status text NOT NULL, lock uuid, lease_expires_at timestamptz,
    payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz, finished_at timestamptz)
"""


async def main(db_url: str, amqp_url: str, n: int) -> dict[str, float]:
    db = await asyncpg.connect(db_url)
    await db.execute(DDL)
    await db.execute("TRUNCATE substrate_job")
    conn = await aio_pika.connect(amqp_url)
    ch = await conn.channel(publisher_confirms=True)
    qname = f"substrate.{uuid.uuid4().hex[:8]}"
    await ch.declare_queue(qname, durable=True, arguments={"x-queue-type": "quorum"})
    t0 = time.perf_counter()
    for _ in range(n):
        jid = uuid.uuid4()
        await db.execute("INSERT INTO substrate_job (id, status, payload) VALUES ($1, 'queued', "
                         "'{}')", jid)
        await ch.default_exchange.publish(
            aio_pika.Message(str(jid).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=qname)
    publish_s = time.perf_counter() - t0

    cch = await conn.channel()
    await cch.set_qos(prefetch_count=1)
    cq = await cch.get_queue(qname)
    done = 0
    t1 = time.perf_counter()
    async with cq.iterator() as it:
        async for msg in it:
            jid = uuid.UUID(msg.body.decode())
            lock = await db.fetchval(
                "UPDATE substrate_job SET status = 'active', lock = gen_random_uuid(), "
                "lease_expires_at = now() + interval '30 s', started_at = now() "
                "WHERE id = $1 AND status = 'queued' RETURNING lock", jid)
            await msg.ack()
            if lock is not None:
                await db.execute(
                    "UPDATE substrate_job SET status = 'completed', finished_at = now() "
                    "WHERE id = $1 AND lock = $2 AND status = 'active'", jid, lock)
            done += 1
            if done == n:
                break
    drain_s = time.perf_counter() - t1
    await cch.queue_delete(qname)
    await conn.close()
    await db.execute("DROP TABLE substrate_job")
    await db.close()
    return {"publish_per_s": n / publish_s, "drain_per_s": n / drain_s}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))))
