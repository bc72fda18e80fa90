"""The ``jobq`` command line: every verb, flag and help text, and the
duration syntax (``7d``). ``cli.py`` runs what this parses. The queue
settings' flags come from ``queues.py``, so every setting has one."""

from __future__ import annotations

import argparse
import math
from typing import Any

from jobq.errors import BadInput
from jobq.queues import SETTINGS

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, *, unit_required: bool = False) -> float:
    """'90s', '15m', '12h', '7d', '2w' (or plain seconds) -> seconds."""
    t = text.strip().lower()
    try:
        if t and t[-1] in _UNITS:
            value = float(t[:-1]) * _UNITS[t[-1]]
        elif unit_required:
            raise BadInput(f"bad duration {text!r}: give a unit (s, m, h, d or w), e.g. 7d; "
                           "a bare number is ambiguous here")
        else:
            value = float(t)
    except ValueError:
        raise BadInput(f"bad duration {text!r}: use a number with s, m, h, d or w, "
                       "e.g. 7d") from None
    if value < 0 or not math.isfinite(value):
        raise BadInput(f"bad duration {text!r}: must be a positive, finite duration")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jobq",
        description="Crash-safe background jobs: RabbitMQ delivers ids, PostgreSQL holds "
                    "the lease. Configure with JOBQ_DATABASE_URL and JOBQ_AMQP_URL.",
    )
    from jobq import __version__, cli_schedule

    p.add_argument("--version", action="version", version=f"jobq {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _install(sub)
    _services(sub)
    _publishing(sub)
    cli_schedule.add_parser(sub)
    _queues(sub)
    _reading(sub)
    _job_verbs(sub)
    return p


def _install(sub: Any) -> None:
    mig = sub.add_parser(
        "migrate", help="create or upgrade the jobq schema (safe to rerun)",
        description="Apply the numbered migrations in schema/ that the database does not have "
        "yet, each in its own transaction, under an advisory lock: safe to run twice or from "
        "several places at once. Creates the group roles jobq_owner, jobq_producer, "
        "jobq_consumer, jobq_reaper and jobq_reader if missing (needs CREATEROLE then), and "
        "needs CREATE on the database the first time; an up-to-date schema needs neither.")
    mig.add_argument("--create-database", action="store_true",
                     help="first create the database of JOBQ_DATABASE_URL if it does not exist "
                     "(connecting to the server's postgres database)")
    mig.add_argument("--declare", action="store_true",
                     help="then declare the broker topology, as `jobq declare` does")
    dec = sub.add_parser(
        "declare", help="declare the exchange and every queue's broker queue",
        description="Declare jobq's exchange, dead-letter exchange and queue, and the durable "
        "queue of every queue in jobq.queue (and of each QUEUE named), with a RabbitMQ user "
        "that has configure permission. Services whose users have none then only check "
        "that these exist. Run it again after adding a queue.")
    dec.add_argument("queues", metavar="QUEUE", nargs="*", help="also declare these queues")

    un = sub.add_parser(
        "uninstall", help="remove jobq from this database and broker namespace",
        description="Remove what `jobq migrate --declare` made: the jobq schema (every job and "
        "its history), what jobq's group roles own or were granted in this database, the roles "
        "themselves where no other database uses them, and the namespace's exchanges and "
        "queues on the broker. Without --yes it only says what it would remove.")
    un.add_argument("--yes", action="store_true", help="remove it (there is no undo)")


def _services(sub: Any) -> None:
    con = sub.add_parser(
        "consume", help="run handlers of APP (module:attribute)",
        description="Run a consumer until SIGTERM or Ctrl-C: it claims jobs of APP's queues, "
        "renews their leases while the handlers run, and records how each ended. On SIGTERM it "
        "stops taking jobs, lets running ones finish within JOBQ_CONSUMER__SHUTDOWN_GRACE_S and "
        "releases the rest at once, uncharged. JOBQ_HEALTH_PORT serves /healthz, /readyz, "
        "/metrics.")
    con.add_argument("app", metavar="APP", help="e.g. jobq.demo:app")
    con.add_argument("--queue", "-q", action="append", dest="queues", metavar="Q",
                     help="queue to consume (repeatable; default: every queue APP handles)")
    con.add_argument("--concurrency", "-c", type=int, default=None, metavar="N",
                     help="jobs run at once by this process (default JOBQ_CONSUMER__CONCURRENCY)")
    con.add_argument("--pool", choices=("thread", "process"), default=None,
                     help="where sync handlers run: a thread pool (default) or pre-started "
                          "child processes, one per slot: a child's death is charged to its "
                          "job alone, and lease loss or a timeout stops the handler "
                          "(JOBQ_CONSUMER__POOL)")
    con.add_argument("--max-jobs-per-child", type=int, default=None, metavar="N",
                     help="--pool process: replace a child after N jobs")
    con.add_argument("--max-memory-per-child", type=float, default=None, metavar="MB",
                     help="--pool process: replace a child whose RSS is over MB after a job")

    sub.add_parser("reap", help="requeue lapsed leases and publish what is due",
                   description="Run a reaper until SIGTERM: requeue jobs whose lease lapsed "
                   "(charging a stall only on evidence, see README), publish retries, delayed "
                   "and SQL-enqueued jobs when due, republish ids the broker lost, prune "
                   "finished jobs by their queue's retention. Run any number: they are peers. "
                   "JOBQ_HEALTH_PORT serves /healthz, /readyz and /metrics.")

    dash = sub.add_parser(
        "dashboard", help="serve the web dashboard (read-only unless --allow-actions)",
        description="Queues, running, stalled, failed, each job's timeline, workers and "
        "reapers, as web pages. Pages read as jobq_reader when the login is a member of it. "
        "--allow-actions lets operators who sign in with JOBQ_DASHBOARD_TOKEN retry and "
        "cancel jobs (written to the job's history with their name).")
    dash.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    dash.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    dash.add_argument("--refresh", type=int, default=5, metavar="SECONDS",
                      help="pages reload themselves this often (default 5; 0 = never)")
    dash.add_argument("--allow-actions", action="store_true",
                      help="retry and cancel buttons, for operators signed in with the token")



def _publishing(sub: Any) -> None:
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
    pub.add_argument("--lines", action="store_true",
                     help="bulk: JSON names a file (- for stdin) of payloads, one JSON value "
                     "per line; all are checked first, then committed in batches of 1,000 "
                     "whose ids the reapers' relay publishes (a reaper must run); prints "
                     "one id per line as each batch commits")

    wait = sub.add_parser("wait", help="wait for a job to end and print its result",
                          description="Block until the job completes and print its result "
                          "as JSON (null if its handler returned None); exit 1 with the "
                          "reason if it failed or was cancelled, or after --timeout.")
    wait.add_argument("id", metavar="ID")
    wait.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                      help="give up after this long (exit 1; the job goes on)")


def _queues(sub: Any) -> None:
    qp = sub.add_parser("queue", help="per-queue settings, pause and resume, delete",
                        description="Show and change per-queue settings, pause and resume a "
                        "queue, limit how queues are created, delete an idle queue.")
    qsub = qp.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    qs = qsub.add_parser("set", help="create a queue or change its settings",
                         description="Create QUEUE if it does not exist and change the "
                         "settings given; the others keep their values.")
    qs.add_argument("name", metavar="QUEUE")
    for q in SETTINGS:
        qs.add_argument(q.flag, *q.aliases, dest=q.column, default=None,
                        metavar="on|off" if q.kind is bool else "N",
                        help=f"{q.help} (default {q.default if q.default is not None else 'none'})")
    for verb, what in (("pause", "from the next claim on no job of QUEUE starts anywhere; "
                                 "running jobs finish, publishing goes on, nothing is lost or "
                                 "charged"),
                       ("resume", "jobs of QUEUE start again; what waited is published at "
                                  "once")):
        v = qsub.add_parser(verb, help=what.split(";")[0], description=what[0].upper() + what[1:]
                            + ".")
        v.add_argument("name", metavar="QUEUE")
    qsub.add_parser("list", help="show every queue's settings",
                    description="Every queue with its settings (jobq.queue); see "
                    "`jobq queue set --help` for what each means.")
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



def _reading(sub: Any) -> None:
    sub.add_parser("stats", help="jobs per queue and state (stalled = lease lapsed, not reaped)",
                   description="Per queue: queued, delayed, running, stalled (active with a "
                   "lapsed lease that no reaper requeued yet: marked (!)), completed, failed, "
                   "cancelled, the oldest wait, completions in the last minute, and whether "
                   "it is paused. The same as SELECT * FROM jobq.queue_stats.")
    ks = sub.add_parser("keys", help="per key: queued, running, oldest wait",
                        description="Per key of QUEUE (or of every queue): jobs waiting, "
                        "running, and the oldest wait in seconds, most waiting first (at most "
                        "1,000 rows). The same as SELECT * FROM jobq.key_stats.")
    ks.add_argument("queue", metavar="QUEUE", nargs="?", default=None)
    ins = sub.add_parser("inspect", help="show one job row and its history, or a workflow",
                         description="The job's row and its history, oldest first: who "
                         "claimed it, why it stalled or was released, who completed it — the "
                         "answer to 'why did this run twice?'. Control characters in payloads "
                         "and errors are shown escaped.")
    ins.add_argument("id", metavar="ID")


def _job_verbs(sub: Any) -> None:
    rt = sub.add_parser(
        "retry", help="put a failed job (or every failed job of a queue) back in line",
        description="A failed or cancelled job goes back to queued with fresh error and stall "
        "allowances, and its id is published at once. With --queue, every job of QUEUE in "
        "the --status given (default failed), in batches of 1,000.")
    rt.add_argument("id", metavar="ID", nargs="?", default=None)
    _bulk(rt, "retry", ("failed", "cancelled"), "failed")
    cn = sub.add_parser(
        "cancel", help="cancel a job, a workflow's steps, or every queued job of a queue",
        description="A queued job is cancelled at once; an active one stops at its worker's "
        "next renewal. A workflow's id cancels its steps not started. With --queue, every job "
        "of QUEUE in the --status given (default queued), in batches of 1,000.")
    cn.add_argument("id", metavar="ID", nargs="?", default=None)
    cn.add_argument("--reason", default=None, help="recorded in last_error and the history")
    _bulk(cn, "cancel", ("queued", "active"), "queued")
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


def _bulk(p: argparse.ArgumentParser, verb: str, statuses: tuple[str, ...],
          default: str) -> None:
    p.add_argument("--queue", default=None, metavar="QUEUE",
                   help=f"{verb} every job of QUEUE in --status instead of one ID")
    p.add_argument("--status", action="append", choices=statuses, default=None,
                   help=f"with --queue: which jobs (repeatable; default {default})")
    p.add_argument("--dry-run", action="store_true",
                   help=f"with --queue: only count the jobs it would {verb}")
