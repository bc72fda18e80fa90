"""``jobq schedule set|list|trigger|backfill|delete``: periodic jobs from the command line
(schedules.py owns what a schedule is, reaper/periodic.py how slots fire). Operator verbs:
they run as the schema owner, like ``queue set``."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from jobq.db import open_pool
from jobq.errors import BadInput
from jobq.ops import schedule_admin as admin
from jobq.ops.common import decode, table
from jobq.schedules import Schedule
from jobq.settings import Settings


def register(sub: Any) -> None:
    sch = sub.add_parser("schedule", help="periodic jobs: set, list, trigger, backfill, delete",
                         description="Schedules enqueue a job per slot (cron in a time zone, "
                         "or every N seconds); the reapers fire each slot exactly once, and "
                         "slots missed while no reaper ran are run once at catch-up "
                         "(backfill enqueues the others).")
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
    put.add_argument("--overlap", choices=("allow", "skip"),
                     help="allow (a job every slot, the default) or skip (no slot enqueues "
                     "while the schedule's last job is queued or running; skipped slots are "
                     "listed); unchanged when not given")
    trig = verbs.add_parser("trigger", help="one job of a schedule now",
                            description="Enqueue one job of schedule NAME now, with its queue "
                            "and payload; its slots are unchanged. Under overlap skip, refused "
                            "while its last job is queued or running. Prints the job id.")
    trig.add_argument("name", metavar="NAME")
    back = verbs.add_parser("backfill", help="enqueue the slots of a past range that have no job",
                            description="Enqueue a job for every slot of schedule NAME from "
                            "--from to --to (both included, up to now) that has no job yet "
                            "(a slot whose job was pruned counts as missing). Run it twice: "
                            "the second run enqueues nothing. Overlap is not applied. At most "
                            "10,000 slots a run.")
    back.add_argument("name", metavar="NAME")
    back.add_argument("--from", dest="start", required=True, metavar="TIME",
                      help="ISO 8601 with a zone, e.g. 2026-12-01T00:00Z")
    back.add_argument("--to", dest="end", required=True, metavar="TIME",
                      help="ISO 8601 with a zone, at most now")
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
    return Schedule(args.name, queue, payload, args.cron, args.every, args.tz, not args.disabled,
                    args.overlap or "allow")


def _when(text: str, flag: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadInput(f"{flag} {text!r} is not a time: use ISO 8601 with a zone, e.g. "
                       "2026-12-01T00:00Z") from None
    if t.tzinfo is None:
        raise BadInput(f"{flag} {text!r} has no time zone: add one (Z for UTC, or +01:00)")
    return t


async def run(settings: Settings, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Do the verb; returns rows to print."""
    s = _schedule(args) if args.verb == "set" else None  # checked before connecting
    span = ((_when(args.start, "--from"), _when(args.end, "--to")) if args.verb == "backfill"
            else None)
    pool = await open_pool(settings.database_url, wait=False, app_name="jobq-cli",
                           pooled=settings.database_pooled)
    try:
        if s is not None:
            await admin.set_schedule(pool, s, keep_overlap=args.overlap is None)
        elif args.verb == "trigger":
            return [{"schedule": args.name, "job": await admin.trigger_schedule(pool, args.name)}]
        elif span is not None:
            made = await admin.backfill_schedule(pool, args.name, *span)
            return [{"slot": r["slot"], "job": r["id"]} for r in made] or [
                {"slot": "(none missing)", "job": ""}]
        elif args.verb == "delete":
            await admin.delete_schedule(pool, args.name)
            return [{"deleted": args.name}]
        rows = await admin.schedules(pool)
        if args.verb == "set":
            rows = [r for r in rows if r["name"] == args.name]
        return [{"name": r["name"], "queue": r["queue"],
                 "when": (f"cron {r['cron']} {r['timezone']}" if r["cron"]
                          else f"every {r['interval_s']:g}s"),
                 "enabled": r["enabled"], "overlap": r["overlap"],
                 "next_run_at": r["next_run_at"], "last_job": r["last_job_id"],
                 "skipped": (f"{r['skipped_total']} (last {r['last_skipped']:%Y-%m-%d %H:%M:%S})"
                             if r["skipped_total"] else 0),
                 "source": r["source"],
                 "last_error": r["last_error"]} for r in rows]
    finally:
        await pool.close()


async def schedule(settings: Settings, args: argparse.Namespace) -> None:
    rows = await run(settings, args)
    if args.verb == "trigger":  # the id alone, as jobq publish prints it
        print(rows[0]["job"])
    elif args.verb == "delete":  # one line that says it happened, not an empty table
        print(f"deleted schedule {rows[0]['deleted']}: no more slots fire (a job it "
              "enqueued already runs as any job)")
    else:
        table(rows)
