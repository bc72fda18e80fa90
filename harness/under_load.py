"""A fault under load, counted from the database (issue #15): a producer of
single-job publishes, consumers and reapers run while ``fault`` does its
harm; then every published job must complete. The tests run it short, the
benchmarks (bench/clusters.py) long.

What is counted, all from the job rows, ``test_completion`` (below) and ``test_run``
(every handler start, harness/apps.py):

- lost: published jobs (their ids returned to the caller) not completed by
  the deadline; ``vanished``: of those, the ones with no row at all;
- completed twice: jobs whose row became ``completed`` in more than one
  committed transaction, as a trigger installed for the run records them
  (``test_completion``; jobq keeps no history row for a completion, and the
  row itself only shows the last one);
- re-runs: handler starts beyond one per job;
- recovered_s: from the fault's first moment (database clock) to the end
  of the last half second, while the producer ran, with completions under
  half the rate before it (0: never that low).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.helpers import Proc, Procs, SyncDB, wait_until
from harness.load import produce

# An observer, not a mock: every committed transition of a job row to
# 'completed' leaves a row here, in the same transaction (so a completion lost
# in a failover leaves none, as it leaves no completed row).
COMPLETIONS_DDL = """
CREATE TABLE IF NOT EXISTS public.test_completion (
    job_id uuid NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION public.test_note_completion() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO public.test_completion (job_id) VALUES (NEW.id);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER test_completion AFTER UPDATE OF status ON jobq.job
FOR EACH ROW WHEN (NEW.status = 'completed' AND OLD.status <> 'completed')
EXECUTE FUNCTION public.test_note_completion();
"""


@dataclass
class Run:
    db: SyncDB
    procs: Procs
    consumers: list[Proc]
    reapers: list[Proc]
    fault_at: list[Any] = field(default_factory=list)  # database timestamps
    healed_at: list[Any] = field(default_factory=list)

    def mark(self) -> None:
        """The fault starts now (as the database sees it)."""
        self.fault_at.append(self.db.val("SELECT now()"))

    def healed(self) -> None:
        """The fault ends now (a node back, a link up)."""
        self.healed_at.append(self.db.val("SELECT now()"))


def under_load(db: SyncDB, procs: Procs, settings: Any, fault: Callable[[Run], None], *,
               env: dict[str, str] | None = None, consumers: int = 2, reapers: int = 2,
               rate: float = 100, seconds: float = 12, warmup_s: float = 2,
               concurrency: int = 8, sleep_s: float = 0.05,
               timeout_s: float = 90, tolerate_refusals: bool = False,
               start_consumer: Callable[[int], Proc] | None = None) -> dict[str, Any]:
    """``start_consumer(i)``, if given, starts consumer i (e.g. on a host of
    its own); otherwise each is ``consume harness.apps:app`` with ``env``."""
    env = env or {}
    db.execute(COMPLETIONS_DDL)
    start = start_consumer or (
        lambda _i: procs.consumer("--concurrency", str(concurrency), environ=env))
    run = Run(db, procs, [start(i) for i in range(consumers)],
              [procs.reaper(environ=env) for _ in range(reapers)])
    for c in run.consumers:
        c.worker_id()
    ids: list[Any] = []
    errors: list[BaseException] = []
    refused: list[Any] | None = [] if tolerate_refusals else None

    def producer() -> None:
        try:
            produce(settings, rate, seconds, ids, payload={"sleep": sleep_s}, refused=refused)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    time.sleep(warmup_s)
    fault(run)
    t.join(seconds + 120)
    assert not errors, f"the producer failed: {errors[0]!r}"

    def all_done() -> bool:
        # A row that vanished (a failover to a standby that never got it) does
        # not come back: wait for the rows that exist.
        return bool(db.val("SELECT count(*) FILTER (WHERE status <> 'completed') = 0 "
                           "FROM jobq.job WHERE id = ANY($1)", ids))

    try:
        wait_until(all_done, timeout_s, "every published job completed", interval=0.5)
    except AssertionError:
        pass  # counted as lost below
    out = {"jobs": len(ids), **count(db, ids, run.fault_at[0] if run.fault_at else None)}
    if run.fault_at and run.healed_at:
        outage = (run.healed_at[0] - run.fault_at[0]).total_seconds()
        out["outage_s"] = round(outage, 2)
        out["back_after_heal_s"] = round(max(0.0, out["recovered_s"] - outage), 2)
    if refused is not None:
        out["publishes_refused"] = len(refused)  # raised to the caller: nothing promised
    return out


def count(db: SyncDB, ids: list[Any], fault_at: Any) -> dict[str, Any]:
    lost = db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status <> 'completed'",
                  ids) + len(ids) - db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1)",
                                            ids)
    twice = db.val("""SELECT count(*) FROM (SELECT job_id FROM public.test_completion
                      WHERE job_id = ANY($1) GROUP BY job_id HAVING count(*) > 1) t""", ids)
    starts = db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)", ids)
    vanished = len(ids) - db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1)", ids)
    out: dict[str, Any] = {"lost": lost, "vanished": vanished, "completed_twice": twice,
                           "reruns": starts - (len(ids) - lost)}
    if fault_at is not None:
        out["recovered_s"] = recovered_s(db, ids, fault_at)
    return out


def recovered_s(db: SyncDB, ids: list[Any], fault_at: Any) -> float:
    """Seconds from the fault to the end of the last half second, while the
    producer still ran, in which fewer jobs completed than half the rate
    before the fault (0: throughput never dropped that far)."""
    row = db.fetchrow("""
        WITH j AS (SELECT finished_at, created_at FROM jobq.job WHERE id = ANY($1)),
        rate AS (SELECT count(*) / greatest(extract(epoch FROM $2 - min(finished_at)), 1) AS r
                 FROM j WHERE finished_at < $2),
        buckets AS (SELECT b FROM generate_series(0, (SELECT floor(extract(epoch FROM
                        max(created_at) - $2) * 2)::int - 2 FROM j)) AS b)
        SELECT max(b + 1) / 2.0 AS back FROM buckets
        WHERE (SELECT count(*) FROM j WHERE finished_at >= $2 + make_interval(secs => b / 2.0)
               AND finished_at < $2 + make_interval(secs => (b + 1) / 2.0))
              < (SELECT r FROM rate) / 4""", ids, fault_at)
    return 0.0 if row is None or row["back"] is None else round(float(row["back"]), 2)
