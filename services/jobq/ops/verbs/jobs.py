"""``jobq retry``, ``cancel`` and ``prune``: one job, a workflow, or every job of
a queue. Verbs that change many jobs take ``--dry-run`` and say how many they
changed."""

from __future__ import annotations

import argparse
from typing import Any

from jobq.errors import BadInput
from jobq.ops.common import admin_call, parse_duration, parse_id
from jobq.settings import Settings


def register(sub: Any) -> None:
    rt = sub.add_parser(
        "retry", help="put a failed job (or every failed job of a queue) back in line",
        description="A failed or cancelled job goes back to queued with fresh error and stall "
        "allowances, and its id is published at once. With --queue, every job of QUEUE in "
        "the --status given (default failed), in batches of 1,000.")
    rt.add_argument("id", metavar="ID", nargs="?", default=None)
    _bulk(rt, "retry", ("failed", "cancelled"), "failed")
    rt.set_defaults(run=retry)
    cn = sub.add_parser(
        "cancel", help="cancel a job, a workflow's steps, or every queued job of a queue",
        description="A queued job is cancelled at once; an active one stops at its worker's "
        "next renewal. A workflow's id cancels its steps not started. With --queue, every job "
        "of QUEUE in the --status given (default queued), in batches of 1,000.")
    cn.add_argument("id", metavar="ID", nargs="?", default=None)
    cn.add_argument("--reason", default=None, help="recorded in last_error and the history")
    _bulk(cn, "cancel", ("queued", "active"), "queued")
    cn.set_defaults(run=cancel)
    pr = sub.add_parser("prune", help="delete finished jobs (and their history) in batches",
                        description="Delete completed, failed and cancelled jobs that finished "
                        "more than --older-than ago, with their history, in short batches. "
                        "The reapers also prune by each queue's retention.")
    pr.add_argument("--older-than", required=True, metavar="DURATION",
                    help="finished more than this long ago, with a unit: 90s, 15m, 12h, 7d, 2w")
    pr.add_argument("--batch", type=int, default=1000, metavar="N",
                    help="rows per delete statement (default 1000)")
    pr.add_argument("--dry-run", action="store_true",
                    help="only count what would be deleted")
    pr.add_argument("--force", action="store_true",
                    help="allow --older-than under a minute (deletes jobs finished just now)")
    pr.set_defaults(run=prune)


def _bulk(p: argparse.ArgumentParser, verb: str, statuses: tuple[str, ...],
          default: str) -> None:
    p.add_argument("--queue", default=None, metavar="QUEUE",
                   help=f"{verb} every job of QUEUE in --status instead of one ID")
    p.add_argument("--status", action="append", choices=statuses, default=None,
                   help=f"with --queue: which jobs (repeatable; default {default})")
    p.add_argument("--dry-run", action="store_true",
                   help=f"with --queue: only count the jobs it would {verb}")


def _one_or_queue(args: argparse.Namespace, verb: str) -> None:
    if (args.id is None) == (args.queue is None):
        raise BadInput(f"give a job id or --queue QUEUE (jobq {verb} --help)")
    if args.id is not None and (args.status or args.dry_run):
        raise BadInput("--status and --dry-run go with --queue")


async def retry(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.client.producer import Client
    from jobq.ops import admin

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
