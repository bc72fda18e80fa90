"""``jobq schedule set|list|delete``: periodic jobs from the command line
(schedules.py owns what a schedule is, reaper/periodic.py how slots fire). Operator verbs:
they run as the schema owner, like ``queue set``."""

from __future__ import annotations

import argparse
from typing import Any

from jobq.db import open_pool
from jobq.errors import BadInput
from jobq.ops import admin
from jobq.ops.common import decode, table
from jobq.schedules import Schedule
from jobq.settings import Settings


def register(sub: Any) -> None:
    sch = sub.add_parser("schedule", help="periodic jobs: set, list, delete",
                         description="Schedules enqueue a job per slot (cron in a time zone, "
                         "or every N seconds); the reapers fire each slot exactly once, and "
                         "slots missed while no reaper ran are run once at catch-up.")
    verbs = sch.add_subparsers(dest="verb", required=True, metavar="VERB")
    put = verbs.add_parser("set", help="create or change a schedule",
                           description="Store schedule NAME: a job for QUEUE at every slot of "
                           "--cron (in --tz) or --every seconds. Setting it again changes it.")
    put.add_argument("name", metavar="NAME")
    put.add_argument("queue", metavar="QUEUE", nargs="?", help="the queue its jobs go to")
    put.add_argument("--queue", dest="queue_opt", metavar="QUEUE", help="the same, as a flag")
    when = put.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="five-field cron expression, e.g. '0 3 * * *'")
    when.add_argument("--every", "--interval", type=float, metavar="SECONDS",
                      help="an interval instead")
    put.add_argument("--tz", "--timezone", default="UTC", metavar="ZONE",
                     help="IANA time zone of the cron expression (default UTC)")
    put.add_argument("--payload", default="{}", metavar="JSON", help="the jobs' payload")
    put.add_argument("--disabled", action="store_true", help="stored, but fires nothing")
    verbs.add_parser("list", help="every schedule and its next slot",
                     description="Every schedule: its queue, timing, next slot, last fired "
                     "slot and last error.")
    rm = verbs.add_parser("delete", help="remove a schedule (its jobs stay)",
                          description="Remove schedule NAME; jobs it already enqueued stay.")
    rm.add_argument("name", metavar="NAME")
    sch.set_defaults(run=schedule)


def _schedule(args: argparse.Namespace) -> Schedule:
    payload = decode(args.payload, "--payload")
    queue = args.queue or args.queue_opt
    if not queue or (args.queue and args.queue_opt and args.queue != args.queue_opt):
        raise BadInput("give the schedule's queue once: jobq schedule set NAME QUEUE ...")
    return Schedule(args.name, queue, payload, args.cron, args.every, args.tz, not args.disabled)


async def run(settings: Settings, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Do the verb; returns rows to print."""
    s = _schedule(args) if args.verb == "set" else None  # checked before connecting
    pool = await open_pool(settings.database_url, wait=False, app_name="jobq-cli",
                           pooled=settings.database_pooled)
    try:
        if s is not None:
            await admin.set_schedule(pool, s)
        elif args.verb == "delete":
            await admin.delete_schedule(pool, args.name)
            return []
        rows = await admin.schedules(pool)
        if args.verb == "set":
            rows = [r for r in rows if r["name"] == args.name]
        return [{"name": r["name"], "queue": r["queue"],
                 "when": (f"cron {r['cron']} {r['timezone']}" if r["cron"]
                          else f"every {r['interval_s']:g}s"),
                 "enabled": r["enabled"], "next_run_at": r["next_run_at"],
                 "last_job": r["last_job_id"], "source": r["source"],
                 "last_error": r["last_error"]} for r in rows]
    finally:
        await pool.close()


async def schedule(settings: Settings, args: argparse.Namespace) -> None:
    table(await run(settings, args))
