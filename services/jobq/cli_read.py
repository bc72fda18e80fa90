"""The ``jobq`` command's shared parts and its read verbs (``stats``,
``keys``, ``inspect``: what a ``jobq_reader`` login may run): one admin
action on a short-lived pool, job ids from the command line, tables.
``cli.py`` dispatches; errors are handled there, once."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from jobq.errors import BadInput, UnknownJob
from jobq.logs import printable
from jobq.settings import Settings


def parse_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise BadInput(f"{text!r} is not a job id (expected a UUID)") from None


def decode(text: str, where: str = "payload") -> Any:
    """A payload from JSON text (jobq publish, jobq schedule set); BadInput
    that says what is wrong, also for what json cannot take (too deep)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{where} is not valid JSON ({exc}); e.g. '{{\"to\": \"a@b.c\"}}'") \
            from None
    except (RecursionError, ValueError) as exc:  # nested too deep, a 5,000-digit number
        raise BadInput(f"{where} cannot be decoded: {type(exc).__name__}: {str(exc)[:120]}") \
            from None


async def pool(settings: Settings) -> Any:
    from jobq.db import open_pool

    return await open_pool(settings.database_url, wait=False, app_name="jobq-cli",
                           pooled=settings.database_pooled)


async def admin_call(settings: Settings, action: str, *args: Any) -> Any:
    """Run one admin action on a short-lived pool."""
    from jobq import admin

    p = await pool(settings)
    try:
        return await getattr(admin, action)(p, *args)
    finally:
        await p.close()


def table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("(none)")
        return
    cols = list(rows[0])
    cells = [[("" if r[c] is None else printable(str(r[c]), 200)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


async def stats(settings: Settings) -> None:
    out = []
    for r in await admin_call(settings, "stats"):
        d = dict(r)
        # No job waiting: no wait to show (0 read as "jobs start at once"), as the dashboard
        d["oldest_queued_s"] = ("–" if d["oldest_queued_s"] is None
                                else round(d["oldest_queued_s"], 1))
        if d["stalled"]:
            d["stalled"] = f"{d['stalled']} (!)"
        d["paused"] = "PAUSED" if d["paused"] else ""
        out.append(d)
    table(out)


async def keys(settings: Settings, queue: str | None) -> None:
    table([dict(r) for r in await admin_call(settings, "keys", queue)])


async def inspect(settings: Settings, args: argparse.Namespace) -> None:
    wanted = parse_id(args.id)
    try:
        row, events = await admin_call(settings, "inspect", wanted)
    except UnknownJob:
        steps = await admin_call(settings, "workflow", wanted)
        if not steps:
            raise
        print(f"workflow {wanted}: {len(steps)} step(s)")
        table([{**dict(r), "after": " ".join(str(a)[:8] for a in r["after"])} for r in steps])
        return
    fields_ = dict(row)  # a Record iterates over its values, not its keys
    width = max(len(k) for k in fields_)
    for k, v in fields_.items():
        print(f"{k:<{width}}  {printable(str(v))}")  # payloads and errors are user data
    print()
    table([{"at": e["at"].strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], "event": e["event"],
             "worker": e["worker_id"], "attempt": e["attempt"], "detail": e["detail"]}
            for e in events])
    links, steps = await admin_call(settings, "links_and_steps", wanted)
    for title, rows in (("links", links), ("steps", steps)):
        if rows:
            print(f"\n{title}:")
            table([{k: printable(str(v)) for k, v in dict(r).items()} for r in rows])
