"""The ``jobq`` command.

Expected errors (bad input, a service down, a missing schema) print one line
``jobq: error: ...`` on stderr and exit non-zero: 1 for bad input or an
unreachable service, 2 for bad usage or configuration. Tracebacks are only
for bugs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from jobq import crash, logs
from jobq.arguments import parse_duration, parser
from jobq.cli_read import admin_call, inspect, keys, parse_id, stats, table
from jobq.errors import BadInput, ConfigError, JobqError
from jobq.queues import SETTINGS
from jobq.settings import Settings

log = logging.getLogger("jobq.cli")

async def _migrate(settings: Settings) -> None:
    from jobq import migrate
    from jobq.db import open_pool, translated

    # A direct session: the migration lock is a session advisory lock.
    pool = await open_pool(settings.session_url, wait=False, app_name="jobq-migrate",
                           check_schema=False)
    try:
        with translated():
            async with pool.acquire() as conn:
                applied = await migrate.apply(conn)
    finally:
        await pool.close()
    print(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")


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


async def _declare(settings: Settings, queues: list[str]) -> None:
    from jobq.topology import declare

    done = await declare(settings, queues)
    print(f"declared the {settings.namespace} exchange and {len(done)} queue(s)")


async def _publish(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.producer import Client, NewJob, validate

    text = sys.stdin.read() if args.payload == "-" else args.payload
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"payload is not valid JSON ({exc}); e.g. '{{\"to\": \"a@b.c\"}}'") from None
    except (RecursionError, ValueError) as exc:  # nested too deep, a 5,000-digit number
        raise BadInput(f"payload cannot be decoded: {type(exc).__name__}: {str(exc)[:120]}") \
            from None
    job = NewJob(args.queue, payload, args.delay, args.idempotency_key, args.priority, args.key,
                 args.debounce, after=tuple(parse_id(a) for a in args.after))
    validate(job)  # before connecting
    async with Client(settings) as client:
        (job_id,) = await client.publish_many([job])
    print(job_id)


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


async def _queue(settings: Settings, args: argparse.Namespace) -> None:
    if args.queue_command == "set":
        values = _setting_values(args)
        rows = [await admin_call(settings, "set_queue", args.name, values)]
    elif args.queue_command in ("pause", "resume"):
        rows = [await admin_call(settings, args.queue_command, args.name)]
    elif args.queue_command == "limits":
        auto = None if args.auto_create is None else args.auto_create == "on"
        rows = [await admin_call(settings, "queue_limits", auto, args.max_queues)]
    else:
        rows = await admin_call(settings, "list_queues")
    table([dict(r) for r in rows])


async def _retry(settings: Settings, args: argparse.Namespace) -> None:
    from jobq import admin
    from jobq.producer import Client

    job_id = parse_id(args.id)
    async with Client(settings) as client:
        assert client.pool is not None
        row = await admin.retry(client.pool, job_id)
        await client.republish([(row["id"], row["queue"], row["lock"])])
    print(f"{job_id} queued again")


async def _cancel(settings: Settings, args: argparse.Namespace) -> None:
    job_id = parse_id(args.id)
    n = await admin_call(settings, "cancel", job_id, args.reason)
    print(f"{job_id} cancelled" + (f" ({n} step(s) not started)" if n != 1 else ""))


async def _prune(settings: Settings, args: argparse.Namespace) -> None:
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


def _run_service(coro: Any) -> None:
    asyncio.run(coro)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(argv[:-1]):  # "--older-than -5d": argparse would take -5d for a flag
        if a == "--older-than" and argv[i + 1].startswith("-"):
            argv[i:i + 2] = [f"--older-than={argv[i + 1]}"]
            break
    args = parser().parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["loc"]:
            where = "JOBQ_" + "__".join(str(x).upper() for x in err["loc"])
            msg = f"bad setting {where}: {msg}"
        print(f"jobq: error: {msg}", file=sys.stderr)  # no input value: it may hold a secret
        sys.exit(2)
    logs.setup(settings.log_level, settings.log_json)
    crash.configure(settings.crash_at)
    code = 0
    try:
        if args.command == "migrate":
            asyncio.run(_migrate(settings))
            if args.declare:
                asyncio.run(_declare(settings, []))
        elif args.command == "wait":
            asyncio.run(_wait(settings, args))
        elif args.command == "schedule":
            from jobq import cli_schedule

            table(asyncio.run(cli_schedule.run(settings, args)))
        elif args.command == "dashboard":
            from jobq.dashboard.server import serve

            asyncio.run(serve(settings, args.host, args.port, args.allow_actions, args.refresh))
        elif args.command == "declare":
            asyncio.run(_declare(settings, args.queues))
        elif args.command == "publish":
            asyncio.run(_publish(settings, args))
        elif args.command == "consume":
            from jobq.app import load
            from jobq.worker.consumer import Consumer

            # Everything jobq imports is imported before the working directory
            # joins the path for APP: a stray uvloop.py there never runs.
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
                    cfg = settings.consumer.model_validate(
                        {**settings.consumer.model_dump(), **chosen})
                except ValidationError as exc:
                    raise ConfigError(f"bad --{exc.errors()[0]['loc'][0]}: "
                                      f"{exc.errors()[0]['msg']}") from exc
                settings = settings.model_copy(update={"consumer": cfg})
            consumer = Consumer(app, settings, args.queues, args.concurrency, app_spec=args.app)
            _run_service(consumer.run())
            # Sync handlers still running in threads must not keep a process
            # whose leases were released alive.
            logging.shutdown()
            sys.stdout.flush()
            os._exit(0)
        elif args.command == "reap":
            from jobq.reaper import Reaper

            _install_uvloop(settings)
            _run_service(Reaper(settings).run())
        elif args.command == "queue":
            asyncio.run(_queue(settings, args))
        elif args.command == "stats":
            asyncio.run(stats(settings))
        elif args.command == "keys":
            asyncio.run(keys(settings, args.queue))
        elif args.command == "inspect":
            asyncio.run(inspect(settings, args))
        elif args.command == "retry":
            asyncio.run(_retry(settings, args))
        elif args.command == "cancel":
            asyncio.run(_cancel(settings, args))
        elif args.command == "prune":
            asyncio.run(_prune(settings, args))
    except ConfigError as exc:
        print(f"jobq: error: {exc}", file=sys.stderr)
        code = 2
    except JobqError as exc:
        print(f"jobq: error: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
