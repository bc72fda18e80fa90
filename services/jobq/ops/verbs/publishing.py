"""``jobq publish`` (one job, or a file of them with ``--lines``), ``jobq
wait`` (for a job's result) and ``jobq signal`` (to a job that waits)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from jobq.errors import BadInput
from jobq.newjob import NewJob
from jobq.ops.common import decode, parse_id
from jobq.settings import Settings


def register(sub: Any) -> None:
    pub = sub.add_parser(
        "publish", help="enqueue a job and print its id",
        description="Insert one job into QUEUE and publish its id; prints the id (--lines: "
        "a job per line of a file, their ids). A queue name not seen before is created with "
        "default settings (said on stderr).")
    pub.add_argument("queue", metavar="QUEUE")
    pub.add_argument("payload", metavar="JSON", nargs="?", default="{}",
                     help="the job's payload as JSON (default {}; - reads it from stdin); "
                     "with --lines, the file of payloads")
    pub.add_argument("--delay", type=float, default=0.0, metavar="SECONDS",
                     help="run no earlier than this many seconds from now")
    pub.add_argument("--idempotency-key", default=None, metavar="KEY",
                     help="publishing the same idempotency key twice yields one job")
    pub.add_argument("--priority", type=int, default=0, metavar="N",
                     help="0 to 9, higher first (default 0): goes ahead of every lower job of "
                     "its queue that has not started")
    pub.add_argument("--key", default=None, metavar="KEY",
                     help="who the job is for (a tenant, a customer): the queue's per-key caps, "
                     "rates and fairness apply to it. Not an idempotency key (it once was: "
                     "see --idempotency-key)")
    pub.add_argument("--after", action="append", default=[], metavar="ID",
                     help="run only once the job ID completed (repeatable); cancelled with "
                     "the reason if it fails or is cancelled")
    pub.add_argument("--debounce", type=float, default=0.0, metavar="SECONDS",
                     help="with --key: jobs of the same queue and key published within this "
                     "time run once, with the last payload, this long after the last publish")
    _key_hold_options(pub)
    pub.add_argument("--expires-in", type=float, default=None, metavar="SECONDS",
                     help="a deadline: not started within this many seconds of now, the job "
                     "is cancelled with reason expired and never runs")
    pub.add_argument("--task", metavar="NAME", help="the named task, where several share "
                     "the queue (the row holds {\"task\": NAME, \"payload\": JSON})")
    pub.add_argument("--lines", action="store_true",
                     help="bulk: JSON names a file (- for stdin) of payloads, one JSON value "
                     "per line; all are checked first, then committed in batches of 1,000 "
                     "whose ids the reapers' relay publishes (a reaper must run); prints "
                     "one id per line as each batch commits")
    pub.set_defaults(run=publish)

    wait_ = sub.add_parser("wait", help="wait for a job to end and print its result",
                          description="Block until the job completes and print its result "
                          "as JSON (null if its handler returned None); exit 1 with the "
                          "reason if it failed or was cancelled, or after --timeout.")
    wait_.add_argument("id", metavar="ID")
    wait_.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                      help="give up after this long (exit 1; the job goes on)")
    wait_.set_defaults(run=wait)

    sig = sub.add_parser("signal", help="send a signal to a job (its handler's job.wait_for)",
                         description="Store signal NAME with a JSON payload for job ID: its "
                         "handler's job.wait_for(NAME) returns the payload, now or in a later "
                         "run, and a job suspended waiting for it is woken. The first signal "
                         "of a name is kept (exit 0 either way; says so). Exit 1 if the job "
                         "does not exist or has ended: nothing is stored.")
    sig.add_argument("id", metavar="ID")
    sig.add_argument("name", metavar="NAME")
    sig.add_argument("payload", metavar="JSON", nargs="?", default="null",
                     help="the signal's payload as JSON (default null; - reads it from stdin)")
    sig.set_defaults(run=signal)


async def publish(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.client.producer import Client
    from jobq.client.store import payload_limits
    from jobq.newjob import NewJob, validate

    if args.key is not None and args.idempotency_key is None:
        # --key once was the idempotency key; an old script's --key now
        # publishes duplicates: say so, on stderr, for this release
        print("jobq: note: --key is the job's flow-control key (per-key caps and fairness), "
              "not an idempotency key: publishing it twice makes two jobs; use "
              "--idempotency-key for that", file=sys.stderr)
    if args.delay < 0:  # typed by hand, a sign is a mistake (Python's delay_s < 0 means now)
        raise BadInput(f"--delay must be 0 or more seconds, got {args.delay:g}: leave it out "
                       "to run the job now")
    if args.lines:
        jobs = bulk_jobs(args)  # checked line by line before connecting
    else:
        text = sys.stdin.read() if args.payload == "-" else args.payload
        jobs = [NewJob(args.queue, _task(args, decode(text)), args.delay, args.idempotency_key,
                       args.priority,
                       args.key, args.debounce, after=tuple(parse_id(a) for a in args.after),
                       expires_in_s=args.expires_in,
                       idempotency_window_s=args.idempotency_window,
                       idempotency_while_live=args.idempotency_while_live,
                       on_duplicate=args.on_duplicate)]
        validate(jobs[0])  # before connecting
    async with Client(settings) as client:
        assert client.pool is not None
        known = await payload_limits(client.pool, [args.queue])
        for i in range(0, len(jobs), BULK_BATCH):
            try:
                ids = await client.publish_many(jobs[i:i + BULK_BATCH], relay=args.lines)
            except BadInput as exc:
                last = min(len(jobs), i + BULK_BATCH)
                raise BadInput(f"{exc} (jobs {i + 1} to {last}; the {i} before them were "
                               "published: their ids are above)" if i else exc) from None
            print("\n".join(map(str, ids)), flush=True)  # committed: what got in, as it does
    if not known:  # a typo would otherwise make a durable queue in silence
        print(f"jobq: created queue {args.queue!r} (a new name; `jobq queue delete "
              f"{args.queue}` removes it once empty)", file=sys.stderr)


BULK_BATCH = 1000  # jobq publish --lines: rows per transaction


def _key_hold_options(pub: argparse.ArgumentParser) -> None:
    """How long --idempotency-key holds, and what a duplicate gets (schema 0032)."""
    hold = pub.add_mutually_exclusive_group()
    hold.add_argument("--idempotency-window", type=float, default=None, metavar="SECONDS",
                      help="with --idempotency-key: the key is held this long after the "
                      "publish, then a publish with it makes a new job")
    hold.add_argument("--idempotency-while-live", action="store_true",
                      help="with --idempotency-key: the key is held while its job is queued "
                      "or running, and freed when it ends")
    pub.add_argument("--on-duplicate", choices=("return", "refuse"), default="return",
                     help="a publish whose idempotency key is held: print the holder's id "
                     "(return, the default) or fail naming it (refuse, exit 1)")


def bulk_jobs(args: argparse.Namespace) -> list[NewJob]:
    """jobq publish --lines: one job per non-blank line of the file or stdin."""
    from jobq.newjob import NewJob, validate

    if (args.idempotency_key or args.after or args.debounce or args.idempotency_window
            or args.idempotency_while_live):
        raise BadInput("--lines publishes many jobs: --idempotency-key (and its window), "
                       "--after and --debounce name one job; leave them out")
    try:
        f = sys.stdin if args.payload == "-" else open(args.payload, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise BadInput(f"cannot read {args.payload}: {exc.strerror}; give a file of one JSON "
                       "payload per line, or - for stdin") from None
    jobs = []
    with f:
        for n, line in enumerate(f, 1):
            if line.strip():
                job = NewJob(args.queue, _task(args, decode(line, f"line {n}")), args.delay, None,
                             args.priority, args.key, expires_in_s=args.expires_in)
                try:
                    validate(job)
                except BadInput as exc:
                    raise BadInput(f"line {n}: {exc}") from None
                jobs.append(job)
    if not jobs:
        raise BadInput(f"no payload in {args.payload}: give one JSON value per line")
    return jobs


async def signal(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.client.producer import Client

    job_id = parse_id(args.id)
    text = sys.stdin.read() if args.payload == "-" else args.payload
    payload = decode(text)
    async with Client(settings) as client:
        kept = await client.signal(job_id, args.name, payload)
    print(f"signal {args.name!r} sent to job {job_id}" if kept else
          f"job {job_id} had a signal {args.name!r} already: the first is kept")


async def wait(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.client.results import wait
    from jobq.db import open_pool

    job_id = parse_id(args.id)
    # LISTEN needs a session of its own: the direct URL behind PgBouncer.
    pool = await open_pool(settings.session_url, wait=False, app_name="jobq-cli", max_size=1)
    try:
        result = await wait(pool, job_id, args.timeout)
    except TimeoutError:
        raise BadInput(f"job {job_id} did not end within {args.timeout:g}s") from None
    finally:
        await pool.close()
    print(json.dumps(result))


def _task(args: argparse.Namespace, payload: Any) -> Any:
    """The payload as published: in a named task's envelope with --task."""
    if args.task is None:
        return payload
    from jobq.handlers import envelope
    from jobq.queues import check_queue_name

    try:
        check_queue_name(args.task)
    except BadInput as exc:
        raise BadInput(str(exc).replace("queue name", "task name")) from None
    return envelope(args.task, payload)
