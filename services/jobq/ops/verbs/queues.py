"""``jobq queue set|list|pause|resume|limits|delete`` and ``jobq keys``: a
queue's settings and state. Operator verbs: they run as the schema owner."""

from __future__ import annotations

import argparse
from typing import Any

from jobq.errors import BadInput
from jobq.ops.common import admin_call, table
from jobq.queues import SETTINGS
from jobq.settings import Settings

LIST = ("Every queue with the settings a team looks at first (lease, attempts, timeout, "
        "limits, key policy, paused): about 70 characters a row besides the name; --wide "
        "shows every "
        "column of jobq.queue and what the live consumers' handlers declare over it. See "
        "`jobq queue set --help` for what each means.")


def register(sub: Any) -> None:
    qp = sub.add_parser("queue", help="per-queue settings, pause and resume, delete",
                        description="Show and change per-queue settings, pause and resume a "
                        "queue, limit how queues are created, delete an idle queue.")
    qsub = qp.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    qp.set_defaults(run=queue)
    qs = qsub.add_parser("set", help="create a queue or change its settings",
                         description="Create QUEUE if it does not exist and change the "
                         "settings given; the others keep their values.")
    qs.add_argument("name", metavar="QUEUE")
    for q in SETTINGS:
        qs.add_argument(q.flag, *q.aliases, dest=q.column, default=None,
                        metavar=("on|off" if q.kind is bool else "|".join(q.choices)
                                 if q.kind is str else "N"),
                        help=f"{q.help} (default {q.default if q.default is not None else 'none'})")
    for verb, what in (("pause", "from the next claim on no job of QUEUE starts anywhere; "
                                 "running jobs finish, publishing goes on, nothing is lost or "
                                 "charged"),
                       ("resume", "jobs of QUEUE start again; what waited is published at "
                                  "once")):
        v = qsub.add_parser(verb, help=what.split(";")[0], description=what[0].upper() + what[1:]
                            + ".")
        v.add_argument("name", metavar="QUEUE")
    qsub.add_parser("list", help="show every queue's settings", description=LIST).add_argument(
        "--wide", action="store_true", help="every setting, and the handlers' declared retries")
    ql = qsub.add_parser("limits", help="show or change whether publishing to a new queue name "
                                        "creates it, and the cap on the number of queues",
                         description="Without flags, show both limits; with flags, change "
                         "them.")
    ql.add_argument("--auto-create", choices=("on", "off"), default=None,
                    help="publishing to an unknown queue name creates it (on) or is refused")
    ql.add_argument("--max-queues", type=int, default=None, metavar="N",
                    help="refuse to create queues beyond this many")
    qd = qsub.add_parser(
        "delete", help="delete an idle queue, its finished jobs and its broker queue",
        description="Delete QUEUE's settings, its finished jobs and their history, and its "
        "queue on the broker. Refused while any of its jobs is queued or running (cancel them "
        "first: jobq cancel --queue QUEUE) or a schedule enqueues into it.")
    qd.add_argument("name", metavar="QUEUE")
    qd.add_argument("--dry-run", action="store_true", help="only say what it would delete")
    ks = sub.add_parser("keys", help="per key: queued, running, oldest wait, limits; set a "
                        "key's tier",
                        usage="jobq keys [QUEUE] | jobq keys set QUEUE KEY [--max-running N] "
                        "[--rate-per-second R]",
                        description="jobq keys [QUEUE]: per key of QUEUE (or of every queue): "
                        "jobs waiting, running, the oldest wait in seconds, the limits that "
                        "apply and whether they are the key's own tier, most waiting first (at "
                        "most 1,000 rows). jobq keys set QUEUE KEY: the key's own limits over "
                        "the queue's per-key defaults (an enterprise tenant at 20 running where "
                        "the others get 2); 0 drops one, a flag not given keeps it. Only on a "
                        "queue with per-key limits.")
    ks.add_argument("words", metavar="QUEUE", nargs="*", help=argparse.SUPPRESS)
    ks.add_argument("--max-running", type=int, metavar="N", help="with set: the key's cap")
    ks.add_argument("--rate-per-second", type=float, metavar="R",
                    help="with set: the key's starts per second")
    ks.set_defaults(run=keys)


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
        if not args.wide:
            table([narrow(dict(r)) for r in rows])
            return
    table([dict(r) for r in rows])


def narrow(r: dict[str, Any]) -> dict[str, Any]:
    """The default view of a queue's row: 8 columns, where the full row is 21
    (~330 characters, as a new user met it); limits off are blank."""
    def limit(running: Any, rate: Any) -> str:
        parts = ([f"≤{running}"] if running is not None else []) + (
            [f"{rate:g}/s"] if rate is not None else [])
        return " ".join(parts)  # ≤5 2.5/s: at most 5 running, 2.5 starts a second

    return {"name": r["name"], "lease_s": f"{r['lease_s']:g}", "attempts": r["max_attempts"],
            "timeout_s": "" if r["timeout_s"] is None else f"{r['timeout_s']:g}",
            "limit": limit(r["max_running"], r["rate_per_s"]),
            "per_key": limit(r["max_running_per_key"], r["rate_per_s_per_key"]),
            "key_policy": r["key_policy"] + (",halts" if r["key_policy"] == "fifo"
                                             and r.get("halt_on_failure") else ""),
            "paused": "paused" if r["paused"] else ""}


async def _delete_queue(settings: Settings, args: argparse.Namespace) -> None:
    from jobq.ops.uninstall import delete_broker_queue

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


async def keys(settings: Settings, args: argparse.Namespace) -> None:
    words = list(args.words)
    if len(words) == 3 and words[0] == "set":
        if args.max_running is None and args.rate_per_second is None:
            raise BadInput("give --max-running N and/or --rate-per-second R (0 drops one)")
        table([dict(await admin_call(settings, "set_key_limit", words[1], words[2],
                                     args.max_running, args.rate_per_second))])
        return
    if len(words) > 1 or args.max_running is not None or args.rate_per_second is not None:
        raise BadInput("use jobq keys [QUEUE], or jobq keys set QUEUE KEY --max-running N "
                       "--rate-per-second R")
    table([dict(r) for r in await admin_call(settings, "keys", words[0] if words else None)])
