"""``jobq audit [ID]``: the invariant monitor's checks (reaper/audit.py) run
now over the whole history, then what they ever found; with an ID, that
job's runs and its violations. Exit 1 when there is any, so a script or a
CI step can gate on it (like fsck). Runs as the schema owner, like the
other operator verbs: the checks record what they find."""

from __future__ import annotations

import argparse
from typing import Any

from jobq.errors import JobqError
from jobq.ops.common import admin_call, parse_id, table
from jobq.settings import Settings


class Violations(JobqError):
    """The audit found jobs that broke an invariant (listed above it)."""


def register(sub: Any) -> None:
    au = sub.add_parser(
        "audit", help="check the history for broken invariants (exit 1 if any)",
        description="Check every job's history now, as the reapers do continuously: no job "
        "claimed by a worker while another worker's claim had not ended (two live leases), "
        "no completion by a worker without the job's live claim, no lease lapsed longer than "
        "--grace seconds and not requeued, no ready job left unpublished that long. Prints "
        "every violation recorded (jobq.invariant_violation) and exits 1 if there is one. "
        "With ID: that job's runs (each claim and what ended it) and its violations.")
    au.add_argument("id", metavar="ID", nargs="?", help="one job")
    au.add_argument("--grace", type=float, default=60.0, metavar="SECONDS",
                    help="how overdue a lease or an unpublished job may be (default 60)")
    au.set_defaults(run=audit)


async def audit(settings: Settings, args: argparse.Namespace) -> None:
    job = parse_id(args.id) if args.id else None
    if not args.grace >= 5:
        raise Violations("--grace must be at least 5 seconds")  # never a false alarm by it
    runs, found = await admin_call(settings, "audit", args.grace, job)
    if job is not None:
        print(f"job {job}: {len(runs)} run(s)")
        table([{"claimed_at": r["at"], "worker": r["worker_id"], "attempt": r["attempt"],
                "ended_by": r["ended_by"] or "(live or completed)",
                "ended_at": r["ended_at"]} for r in runs])
        print()
    if not found:
        print("no invariant violations" + (f" for job {job}" if job else ""))
        return
    table([{"kind": r["kind"], "job": r["job_id"], "queue": r["queue"], "detail": r["detail"],
            "detected_at": r["detected_at"]} for r in found])
    raise Violations(f"{len(found)} invariant violation(s), listed above")
