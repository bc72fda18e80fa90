"""``jobq migrate``, ``declare`` and ``uninstall``: putting jobq into a database
and a broker namespace, and taking it out."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from jobq.settings import Settings


def register(sub: Any) -> None:
    mig = sub.add_parser(
        "migrate", help="create or upgrade the jobq schema (safe to rerun)",
        description="Apply the numbered migrations in schema/ that the database does not have "
        "yet, each in its own transaction, under an advisory lock: safe to run twice or from "
        "several places at once. Creates the group roles jobq_owner, jobq_producer, "
        "jobq_consumer, jobq_reaper and jobq_reader if missing (needs CREATEROLE then), and "
        "needs CREATE on the database the first time; an up-to-date schema needs neither.")
    mig.add_argument("--create-database", action="store_true",
                     help="first create the database of JOBQ_DATABASE_URL if it does not exist "
                     "(connecting to the server's postgres database)")
    mig.add_argument("--declare", action="store_true",
                     help="then declare the broker topology, as `jobq declare` does")
    mig.set_defaults(run=migrate)
    dec = sub.add_parser(
        "declare", help="declare the exchange and every queue's broker queue",
        description="Declare jobq's exchange, dead-letter exchange and queue, and the durable "
        "queue of every queue in jobq.queue (and of each QUEUE named), with a RabbitMQ user "
        "that has configure permission. Services whose users have none then only check "
        "that these exist. Run it again after adding a queue.")
    dec.add_argument("queues", metavar="QUEUE", nargs="*", help="also declare these queues")
    dec.set_defaults(run=declare)

    un = sub.add_parser(
        "uninstall", help="remove jobq from this database and broker namespace",
        description="Remove what `jobq migrate --declare` made: the jobq schema (every job and "
        "its history), what jobq's group roles own or were granted in this database, the roles "
        "themselves where no other database uses them, and the namespace's exchanges and "
        "queues on the broker. Without --yes it only says what it would remove.")
    un.add_argument("--yes", action="store_true", help="remove it (there is no undo)")
    un.set_defaults(run=uninstall)


async def migrate(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.db import open_pool, translated
    from jobq.ops import migrate

    if args.create_database:
        await migrate.create_database(settings.session_url)
    # A direct session: the migration lock is a session advisory lock.
    pool = await open_pool(settings.session_url, wait=False, app_name="jobq-migrate",
                           check_schema=False)
    try:
        with translated():
            async with pool.acquire() as conn:
                applied = await migrate.apply(conn, settings.role_prefix)
                shared = await migrate.shared_with(conn, settings.role_prefix)
    finally:
        await pool.close()
    print(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")
    if shared:  # roles are cluster-wide (roles.py)
        print(f"jobq: warning: the roles {settings.role_prefix}_* also hold rights in "
              f"database(s) {', '.join(shared[:5])}{' ...' if len(shared) > 5 else ''}: a login "
              "granted one reaches those too; give this install roles of its own with "
              "JOBQ_ROLE_PREFIX (docs/how-to/security.md)", file=sys.stderr)
    if args.declare:
        await declare(settings, argparse.Namespace(queues=[]))


async def declare(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.amqp.topology import declare

    done = await declare(settings, args.queues)
    print(f"declared the {settings.namespace} exchange and {len(done)} queue(s)")


async def uninstall(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.ops import uninstall as removal

    plan = await removal.plan(settings)
    for line in plan.describe():
        print(("would remove " if not args.yes else "removing ") + line)
    if not args.yes:
        print("nothing was changed; run `jobq uninstall --yes` to remove all of it",
              file=sys.stderr)
        return
    for line in await removal.run(settings, plan):
        print(line)
