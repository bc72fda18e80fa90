"""``jobq stats`` and ``jobq inspect``: what a ``jobq_reader`` login may run."""

from __future__ import annotations

import argparse
from typing import Any

from jobq.errors import UnknownJob
from jobq.ops.common import admin_call, table
from jobq.settings import Settings
from jobq.telemetry.logs import printable


def register(sub: Any) -> None:
    st = sub.add_parser("stats",
                        help="jobs per queue and state (stalled = lease lapsed, not reaped)",
                        description="Per queue: queued (due and free to start), delayed, "
                        "waiting (for parent jobs), parked (held by the queue's limits), suspended "
                        "(waiting for a signal or children), running, stalled (active with a "
                        "lapsed lease that no reaper requeued yet: marked (!)), completed, failed, "
                        "cancelled, the oldest queued job's wait, completions in the last minute, "
                        "and whether it is paused. The same as SELECT * FROM jobq.queue_stats.")
    st.set_defaults(run=stats)
    ins = sub.add_parser("inspect", help="show one job row and its history, or a workflow",
                         description="The job's row and its history, oldest first: who "
                         "claimed it, why it stalled or was released, who completed it — the "
                         "answer to 'why did this run twice?'; then the last failure's "
                         "traceback, if it has one. Control characters in payloads and errors "
                         "are shown escaped.")
    ins.add_argument("id", metavar="ID", help="a job or workflow id, or its first 8+ hex "
                     "digits as the pages print it")
    ins.set_defaults(run=inspect)


async def stats(settings: Settings, args: argparse.Namespace) -> None:
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


async def inspect(settings: Settings, args: argparse.Namespace) -> None:
    wanted = await admin_call(settings, "resolve", args.id)  # a short id too
    try:
        row, events = await admin_call(settings, "inspect", wanted)
    except UnknownJob:
        steps = await admin_call(settings, "workflow", wanted)
        if not steps:
            raise
        print(f"workflow {wanted}: {len(steps)} step(s)")
        table([{**dict(r), "after": " ".join(str(a)[:8] for a in r["after"]),
                "spawned_by": str(r["spawned_by"] or "")[:8]} for r in steps])
        return
    fields_ = dict(row)  # a Record iterates over its values, not its keys
    tb = fields_.pop("last_traceback", None)
    width = max(len(k) for k in fields_)
    for k, v in fields_.items():
        print(f"{k:<{width}}  {printable(str(v))}")  # payloads and errors are user data
    if tb:  # where the last failure was raised, a line each, escaped like the rest
        print("\nlast traceback:")
        print("\n".join("  " + printable(ln, 1000) for ln in tb.rstrip("\n").splitlines()))
    print()
    table([{"at": e["at"].strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], "event": e["event"],
             "worker": e["worker_id"], "attempt": e["attempt"], "detail": e["detail"]}
            for e in events])
    links, steps = await admin_call(settings, "links_and_steps", wanted)
    for title, rows in (("links", links), ("steps", steps)):
        if rows:
            print(f"\n{title}:")
            table([{k: printable(str(v)) for k, v in dict(r).items()} for r in rows])
