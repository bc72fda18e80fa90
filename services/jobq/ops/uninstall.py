"""Removing jobq from a database and a broker namespace (``jobq uninstall``),
and one queue's broker queue (``jobq queue delete``).

What ``jobq migrate --declare`` made, and nothing else: the ``jobq`` schema
(every job, its history, the queues' settings), what jobq's group roles own
or were granted in this database (``DROP OWNED``: also the default
privileges migrate set for ``jobq_owner``), the group roles themselves when
no other database uses them (roles are cluster-wide: another database's
jobq keeps them), and on the broker the namespace's exchanges, its
dead-letter queue and the queue of every job queue. Logins you created and
made members of the roles are left alone (they lose the membership when a
role goes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aio_pika

from jobq import roles as role_names
from jobq.amqp.broker import Broker
from jobq.amqp.connect import open_connection
from jobq.db import execute, fetch, fetchval, open_pool
from jobq.settings import Settings
from jobq.sql import Q


@dataclass
class Plan:
    database: str
    namespace: str
    installed: bool
    jobs: int = 0
    queues: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        out = []
        if self.installed:
            out.append(f"schema jobq of database {self.database}: {self.jobs} job(s), "
                       f"{len(self.queues)} queue(s)")
        if self.roles:
            out.append(f"what roles {', '.join(self.roles)} own or were granted in "
                       f"{self.database}; the roles too where no other database uses them")
        out.append(f"broker namespace {self.namespace}: exchanges {self.namespace} and "
                   f"{self.namespace}.dlx, queue {self.namespace}.dead"
                   + (f" and {len(self.queues)} job queue(s)" if self.queues else ""))
        return out


async def plan(settings: Settings) -> Plan:
    """What ``run`` would remove (reads only)."""
    pool = await open_pool(settings.session_url, wait=False, app_name="jobq-uninstall",
                           check_schema=False)
    try:
        database = await fetchval(pool, Q["uninstall_database_name"])
        installed = await fetchval(pool, Q["uninstall_schema_exists"])
        roles = [r["rolname"] for r in await fetch(pool, Q["uninstall_roles_present"],
                                                   list(role_names.names(settings.role_prefix)))]
        p = Plan(database, settings.namespace, bool(installed), roles=roles)
        if installed:
            p.jobs = int(await fetchval(pool, Q["uninstall_job_count"]))
            p.queues = [r["name"] for r in await fetch(pool, Q["queue_list"])]
        return p
    finally:
        await pool.close()


async def run(settings: Settings, p: Plan) -> list[str]:
    """Remove it all: the broker's side first (the database still names the
    queues if that fails), then the database's. Returns what it did."""
    done = [await _remove_broker(settings, p.queues)]
    pool = await open_pool(settings.session_url, wait=False, app_name="jobq-uninstall",
                           check_schema=False)
    try:
        await execute(pool, role_names.rename(Q["uninstall_schema"], settings.role_prefix))
        await execute(pool, role_names.rename(Q["uninstall_roles"], settings.role_prefix))
        left = [r["rolname"] for r in await fetch(pool, Q["uninstall_roles_present"],
                                                  list(role_names.names(settings.role_prefix)))]
    finally:
        await pool.close()
    done.append(f"removed schema jobq from database {p.database}")
    gone = [r for r in p.roles if r not in left]
    if gone:
        done.append(f"dropped roles {', '.join(gone)}")
    if left:
        done.append(f"kept roles {', '.join(left)}: another database still uses them "
                    "(uninstall there too, then run this again)")
    return done


async def _remove_broker(settings: Settings, queues: list[str]) -> str:
    ns = settings.namespace
    names = [Broker(settings.amqp_url, ns).queue_name(q) for q in queues] + [f"{ns}.dead"]
    conn = await open_connection(Broker(settings.amqp_url, ns).urls, wait=False)
    try:
        for name in names:
            ch = await conn.channel()
            await ch.queue_delete(name)  # an absent queue is not an error
            await ch.close()
        for exchange in (ns, f"{ns}.dlx"):
            ch = await conn.channel()
            await ch.exchange_delete(exchange)
            await ch.close()
    finally:
        await conn.close()
    return f"removed broker namespace {ns}: {len(names)} queue(s), 2 exchange(s)"


async def delete_broker_queue(settings: Settings, queue: str) -> None:
    """The broker queue of a job queue just deleted from the database."""
    broker = Broker(settings.amqp_url, settings.namespace)
    conn = await open_connection(broker.urls, wait=False)
    try:
        ch = await conn.channel()
        await ch.queue_delete(broker.queue_name(queue))
    except aio_pika.exceptions.ChannelClosed:
        pass  # never declared (no consumer ever ran for it)
    finally:
        await conn.close()
