"""The ``jobq`` command: the verbs' parsers assembled (``ops/verbs/``, one
module per verb group), settings read once, errors handled once.

Expected errors (bad input, a service down, a missing schema) print one line
``jobq: error: ...`` on stderr and exit non-zero: 1 for bad input or an
unreachable service, 2 for bad usage or configuration, 130 after Ctrl-C.
Tracebacks are only for bugs. Output cut short by a closed pipe
(``jobq stats | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from jobq.errors import ConfigError, JobqError
from jobq.ops.verbs import GROUPS
from jobq.runtime import crash
from jobq.settings import Settings
from jobq.telemetry import logs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jobq",
        description="Crash-safe background jobs: RabbitMQ delivers ids, PostgreSQL holds "
                    "the lease. Configure with JOBQ_DATABASE_URL and JOBQ_AMQP_URL.",
    )
    from jobq import __version__

    p.add_argument("--version", action="version", version=f"jobq {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


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
    # Each verb: a coroutine function (run with asyncio.run) or, for the
    # services that set up their own loop, a plain function.
    result = args.run(settings, args)
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
