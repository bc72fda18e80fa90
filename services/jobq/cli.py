"""The ``jobq`` command: one small function per verb, errors handled once.

Expected errors (bad input, a service down, a missing schema) print one line
``jobq: error: ...`` on stderr and exit non-zero: 1 for bad input or an
unreachable service, 2 for bad usage or configuration, 130 after Ctrl-C.
Tracebacks are only for bugs. Output cut short by a closed pipe
(``jobq stats | head``) ends quietly. The operator verbs are in
``cli_admin.py``, the read verbs in ``cli_read.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from jobq import cli_admin, cli_read, crash, logs
from jobq.arguments import parser
from jobq.cli_read import decode, parse_id, table
from jobq.errors import BadInput, ConfigError, JobqError
from jobq.settings import Settings

if TYPE_CHECKING:
    from jobq.newjob import NewJob

log = logging.getLogger("jobq.cli")


async def _migrate(settings: Settings, args: argparse.Namespace) -> None:
    from jobq import migrate
    from jobq.db import open_pool, translated

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
        await _declare(settings, argparse.Namespace(queues=[]))


async def _declare(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.topology import declare

    done = await declare(settings, args.queues)
    print(f"declared the {settings.namespace} exchange and {len(done)} queue(s)")


async def _wait(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.db import open_pool
    from jobq.results import wait

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


async def _publish(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.db import fetch
    from jobq.newjob import NewJob, validate
    from jobq.producer import Client
    from jobq.sql import Q

    if args.key is not None and args.idempotency_key is None:
        # --key once was the idempotency key; an old script's --key now
        # publishes duplicates: say so, on stderr, for this release
        print("jobq: note: --key is the job's flow-control key (per-key caps and fairness), "
              "not an idempotency key: publishing it twice makes two jobs; use "
              "--idempotency-key for that", file=sys.stderr)
    if args.lines:
        jobs = bulk_jobs(args)  # checked line by line before connecting
    else:
        text = sys.stdin.read() if args.payload == "-" else args.payload
        jobs = [NewJob(args.queue, decode(text), args.delay, args.idempotency_key, args.priority,
                       args.key, args.debounce, after=tuple(parse_id(a) for a in args.after))]
        validate(jobs[0])  # before connecting
    async with Client(settings) as client:
        assert client.pool is not None
        known = await fetch(client.pool, Q["queue_limits"], [args.queue])
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


def bulk_jobs(args: argparse.Namespace) -> list[NewJob]:
    """jobq publish --lines: one job per non-blank line of the file or stdin."""
    from jobq.newjob import NewJob, validate

    if args.idempotency_key or args.after or args.debounce:
        raise BadInput("--lines publishes many jobs: --idempotency-key, --after and --debounce "
                       "name one job; leave them out")
    try:
        f = sys.stdin if args.payload == "-" else open(args.payload, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise BadInput(f"cannot read {args.payload}: {exc.strerror}; give a file of one JSON "
                       "payload per line, or - for stdin") from None
    jobs = []
    with f:
        for n, line in enumerate(f, 1):
            if line.strip():
                job = NewJob(args.queue, decode(line, f"line {n}"), args.delay, None,
                             args.priority, args.key)
                try:
                    validate(job)
                except BadInput as exc:
                    raise BadInput(f"line {n}: {exc}") from None
                jobs.append(job)
    if not jobs:
        raise BadInput(f"no payload in {args.payload}: give one JSON value per line")
    return jobs


async def _schedule(settings: Settings, args: argparse.Namespace) -> None:
    from jobq import cli_schedule

    table(await cli_schedule.run(settings, args))


async def _dashboard(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.dashboard.server import serve

    await serve(settings, args.host, args.port, args.allow_actions, args.refresh)


def _consume(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.app import load
    from jobq.worker.consumer import Consumer

    # Everything jobq imports is imported before the working directory joins
    # the path for APP: a stray uvloop.py there never runs.
    _install_uvloop(settings)
    sys.path.insert(0, os.getcwd())
    app = load(args.app)
    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    pool_flags = {"pool": args.pool, "max_jobs_per_child": args.max_jobs_per_child,
                  "max_memory_per_child_mb": args.max_memory_per_child}
    chosen = {k: v for k, v in pool_flags.items() if v is not None}
    if chosen:
        try:
            cfg = settings.consumer.model_validate({**settings.consumer.model_dump(), **chosen})
        except ValidationError as exc:
            raise ConfigError(f"bad --{exc.errors()[0]['loc'][0]}: "
                              f"{exc.errors()[0]['msg']}") from exc
        settings = settings.model_copy(update={"consumer": cfg})
    consumer = Consumer(app, settings, args.queues, args.concurrency, app_spec=args.app)
    asyncio.run(consumer.run())
    # Sync handlers still running in threads must not keep a process whose
    # leases were released alive.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


def _reap(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.reaper import Reaper

    _install_uvloop(settings)
    asyncio.run(Reaper(settings).run())


def _install_uvloop(settings: Settings) -> None:
    if settings.event_loop == "asyncio":
        return
    try:
        import uvloop  # optional: faster event loop (pip install jobq[fast])

        uvloop.install()
    except ImportError:
        if settings.event_loop == "uvloop":
            raise ConfigError("JOBQ_EVENT_LOOP=uvloop, but uvloop is not installed: "
                              "pip install 'jobq[fast]'") from None


Verb = Callable[[Settings, argparse.Namespace], Any]
# Each verb: a coroutine function (run with asyncio.run) or, for the
# services that set up their own loop, a plain function.
VERBS: dict[str, Verb] = {
    "migrate": _migrate, "declare": _declare, "uninstall": cli_admin.uninstall,
    "consume": _consume, "reap": _reap, "dashboard": _dashboard,
    "publish": _publish, "wait": _wait, "schedule": _schedule,
    "queue": cli_admin.queue, "stats": lambda s, a: cli_read.stats(s),
    "keys": lambda s, a: cli_read.keys(s, a.queue), "inspect": cli_read.inspect,
    "retry": cli_admin.retry, "cancel": cli_admin.cancel, "prune": cli_admin.prune,
}


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["loc"]:
            where = "JOBQ_" + "__".join(str(x).upper() for x in err["loc"])
            msg = f"bad setting {where}: {msg}"
        raise ConfigError(msg) from None  # no input value: it may hold a secret


def _argv(argv: Sequence[str] | None) -> list[str]:
    out = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(out[:-1]):  # "--older-than -5d": argparse would take -5d for a flag
        if a == "--older-than" and out[i + 1].startswith("-"):
            out[i:i + 2] = [f"--older-than={out[i + 1]}"]
            break
    return out


def _run(args: argparse.Namespace) -> None:
    settings = _settings()
    logs.setup(settings.log_level, settings.log_json)
    crash.configure(settings.crash_at)
    result = VERBS[args.command](settings, args)
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    sys.stdout.flush()  # here, so a closed pipe is caught below


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(_argv(argv))
    code = 0
    try:
        _run(args)
    except ConfigError as exc:
        print(f"jobq: error: {exc}", file=sys.stderr)
        code = 2
    except JobqError as exc:
        print(f"jobq: error: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `jobq stats | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(code)
