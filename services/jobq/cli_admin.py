"""The ``jobq`` command's operator verbs: queue settings, pause, delete;
retry and cancel of one job or of a whole queue; prune; uninstall.

One small function per verb; each parses what it needs, calls one action in
``admin.py`` (or ``uninstall.py``) and prints one line or a table. Verbs that
change many jobs take ``--dry-run`` and say how many they changed. Errors
are raised as :class:`~jobq.errors.JobqError` and printed once, by
``cli.main``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from jobq.arguments import parse_duration
from jobq.cli_read import admin_call, parse_id, table
from jobq.errors import BadInput
from jobq.queues import SETTINGS
from jobq.settings import Settings


def _setting_values(args: argparse.Namespace) -> dict[str, Any]:
    values = {}
    for q in SETTINGS:
        text = getattr(args, q.column)
        if text is not None:
            try:
                values[q.column] = q.parse(text)
            except argparse.ArgumentTypeError as exc:
                raise BadInput(f"{q.flag} {exc}") from None
    return values


async def queue(settings: Settings, args: argparse.Namespace) -> None:
    verb = args.queue_command
    if verb == "set":
        rows = [await admin_call(settings, "set_queue", args.name, _setting_values(args))]
    elif verb in ("pause", "resume"):
        rows = [await admin_call(settings, verb, args.name)]
    elif verb == "limits":
        auto = None if args.auto_create is None else args.auto_create == "on"
        rows = [await admin_call(settings, "queue_limits", auto, args.max_queues)]
    elif verb == "delete":
        await _delete_queue(settings, args)
        return
    else:
        rows = await admin_call(settings, "list_queues")
    table([dict(r) for r in rows])


async def _delete_queue(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.uninstall import delete_broker_queue

    if args.dry_run:
        counts = await admin_call(settings, "counts", args.name)
        live = counts.get("queued", 0) + counts.get("active", 0)
        done = sum(counts.values()) - live
        print(f"would delete queue {args.name} and its {done} finished job(s)" if not live else
              f"would refuse: {live} job(s) of {args.name} are queued or running")
        return
    jobs = await admin_call(settings, "delete_queue", args.name)
    await delete_broker_queue(settings, args.name)
    print(f"deleted queue {args.name} and its {jobs} finished job(s)")


def _one_or_queue(args: argparse.Namespace, verb: str) -> None:
    if (args.id is None) == (args.queue is None):
        raise BadInput(f"give a job id or --queue QUEUE (jobq {verb} --help)")
    if args.id is not None and (args.status or args.dry_run):
        raise BadInput("--status and --dry-run go with --queue")


async def retry(settings: Settings, args: argparse.Namespace) -> None:
    from jobq import admin
    from jobq.producer import Client

    _one_or_queue(args, "retry")
    statuses = args.status or ["failed"]
    if args.queue is not None and args.dry_run:
        counts = await admin_call(settings, "counts", args.queue)
        print(f"would retry {sum(counts.get(s, 0) for s in statuses)} job(s) of {args.queue}")
        return
    async with Client(settings) as client:
        assert client.pool is not None
        if args.queue is None:
            rows = [await admin.retry(client.pool, parse_id(args.id))]
        else:
            rows = await admin.retry_queue(client.pool, args.queue, statuses)
        # a spell without a token waits for its parents again: its release publishes it
        await client.republish([r for r in rows if r.lock is not None])
    waiting = sum(1 for r in rows if r.lock is None)
    if args.queue is None:
        print(f"{args.id} queued again" + (" (it waits for the jobs it was published after)"
                                            if waiting else ""))
    else:
        print(f"queued {len(rows)} job(s) of {args.queue} again"
              + (f" ({waiting} wait for the jobs they were published after)" if waiting else ""))


async def cancel(settings: Settings, args: argparse.Namespace) -> None:
    _one_or_queue(args, "cancel")
    if args.queue is None:
        job_id = parse_id(args.id)
        n = await admin_call(settings, "cancel", job_id, args.reason)
        print(f"{job_id} cancelled" + (f" ({n} step(s) not started)" if n != 1 else ""))
        return
    statuses = args.status or ["queued"]
    if args.dry_run:
        counts = await admin_call(settings, "counts", args.queue)
        print(f"would cancel {sum(counts.get(s, 0) for s in statuses)} job(s) of {args.queue}")
        return
    n = await admin_call(settings, "cancel_queue", args.queue, statuses, args.reason)
    print(f"cancelled {n} job(s) of {args.queue}")


async def prune(settings: Settings, args: argparse.Namespace) -> None:
    older = parse_duration(args.older_than, unit_required=True)
    if older < 60 and not args.force:
        raise BadInput(f"--older-than {args.older_than} would delete jobs that finished "
                       "under a minute ago; add --force if that is what you want")
    if args.batch < 1:
        raise BadInput("--batch must be at least 1")
    if args.dry_run:
        n = await admin_call(settings, "prunable", older)
        print(f"would prune {n} finished job(s)")
        return
    total = await admin_call(settings, "prune", older, args.batch)
    print(f"pruned {total} finished job(s)")


async def uninstall(settings: Settings, args: argparse.Namespace) -> None:
    from jobq import uninstall as removal

    plan = await removal.plan(settings)
    for line in plan.describe():
        print(("would remove " if not args.yes else "removing ") + line)
    if not args.yes:
        print("nothing was changed; run `jobq uninstall --yes` to remove all of it",
              file=sys.stderr)
        return
    for line in await removal.run(settings, plan):
        print(line)
