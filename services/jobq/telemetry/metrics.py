"""Prometheus metrics of consumers and reapers, served on the health port at
``/metrics``. Names follow the Prometheus conventions (``_total`` counters,
``_seconds`` units); ``queue`` is the label wherever a job is involved.

Monitor the monitor: ``jobq_reaper_last_sweep_timestamp_seconds``,
``jobq_leases_overdue`` (due but not reaped) and
``jobq_oldest_overdue_lease_seconds`` turn a stopped reaper into an alert.
Backlog: ``jobq_queue_depth{queue,state}``,
``jobq_queue_oldest_wait_seconds{queue}``, the suspended jobs by reason
``jobq_queue_suspended{queue,reason}`` and their oldest wait; the rules that use them are in
``deploy/prometheus/jobq-alerts.yaml``.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

# ── consumer ──
JOBS_CLAIMED = Counter("jobq_jobs_claimed_total", "Jobs claimed (handler runs started).",
                       ["queue"], registry=REGISTRY)
JOBS_COMPLETED = Counter("jobq_jobs_completed_total", "Jobs completed.", ["queue"],
                         registry=REGISTRY)
JOBS_RETRIED = Counter("jobq_jobs_retried_total", "Handler errors that will be retried.",
                       ["queue"], registry=REGISTRY)
JOBS_FAILED = Counter("jobq_jobs_failed_total", "Jobs failed for good by a consumer.",
                      ["queue"], registry=REGISTRY)
JOBS_SNOOZED = Counter("jobq_jobs_snoozed_total", "Runs ended by jobq.Snooze or "
                       "jobq.RateLimited (put back, no attempt counted).", ["queue"],
                       registry=REGISTRY)
JOBS_SUSPENDED = Counter("jobq_jobs_suspended_total", "Runs ended by job.sleep or "
                         "job.wait_for (the job waits holding nothing).", ["queue"],
                         registry=REGISTRY)
JOBS_RELEASED = Counter("jobq_jobs_released_total", "Leases released on shutdown.", ["queue"],
                        registry=REGISTRY)
LEASES_LOST = Counter("jobq_leases_lost_total", "Leases a consumer lost (lapsed, reaped or "
                      "self-fenced); a job cancelled while it ran is not counted.", ["queue"],
                      registry=REGISTRY)
BAD_MESSAGES = Counter("jobq_messages_dropped_total", "Delivered ids not run (malformed: each "
                       "line of a body that is not an id): malformed, unknown job, duplicate, "
                       "not due, foreign queue.", ["reason"], registry=REGISTRY)
IDS_HANDED_BACK = Counter("jobq_ids_handed_back_total", "Ids of a packed message that a "
                          "busy consumer published back to the broker, one message each, "
                          "for the rest of the fleet (worker/handback.py).", ["queue"],
                          registry=REGISTRY)
HANDLER_SECONDS = Histogram("jobq_handler_duration_seconds", "Handler run time.",
                            ["queue", "outcome"], registry=REGISTRY)
RENEW_SECONDS = Histogram("jobq_lease_renewal_duration_seconds",
                          "Time of one batched renewal statement.", registry=REGISTRY,
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
CLAIM_SECONDS = Histogram("jobq_claim_duration_seconds",
                          "Time of one batched claim statement (a delivery batch).",
                          registry=REGISTRY,
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
RENEWALS = Counter("jobq_lease_renewals_total", "Batched renewal statements.", ["result"],
                   registry=REGISTRY)
CHILD_DEATHS = Counter("jobq_child_deaths_total", "Handler child processes (--pool process) "
                       "that died running a job; the job is charged one stall.", ["queue"],
                       registry=REGISTRY)
IN_FLIGHT = Gauge("jobq_jobs_in_flight", "Jobs this consumer runs now.", registry=REGISTRY)
LOOP_LAG = Gauge("jobq_event_loop_lag_seconds", "How late the event loop ran a 0.25 s timer "
                 "(last sample).", registry=REGISTRY)

# ── reaper ──
JOBS_STALLED = Counter("jobq_jobs_stalled_total", "Lapsed leases requeued by the reaper.",
                       ["queue"], registry=REGISTRY)
JOBS_OF_DEATH = Counter("jobq_jobs_of_death_total", "Jobs failed after max_stalls.", ["queue"],
                        registry=REGISTRY)
SWEEP_SECONDS = Histogram("jobq_reaper_sweep_duration_seconds", "One reaper sweep.",
                          registry=REGISTRY,
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
SWEEP_FAILURES = Counter("jobq_reaper_sweep_failures_total", "Sweeps that failed (database or "
                         "broker unreachable, or an error).", registry=REGISTRY)
SWEEP_ROWS = Counter("jobq_reaper_rows_total", "Rows a reaper acted on.", ["action"],
                     registry=REGISTRY)
LAST_SWEEP = Gauge("jobq_reaper_last_sweep_timestamp_seconds", "Unix time of the last "
                   "completed sweep of this reaper.", registry=REGISTRY)
OVERDUE = Gauge("jobq_leases_overdue", "Active jobs whose lease lapsed and that no reaper "
                "requeued yet (all queues).", registry=REGISTRY)
OLDEST_OVERDUE = Gauge("jobq_oldest_overdue_lease_seconds", "How long ago the oldest "
                       "unreaped lease lapsed.", registry=REGISTRY)

# Backlog (issue #50): every reaper samples jobq.backlog each backlog_every_s
# and exports the same figures, so alert on max by (queue, state), not sum.
QUEUE_DEPTH = Gauge("jobq_queue_depth", "Queued jobs per queue by state: ready (could start "
                    "now), delayed, waiting (for parent jobs), parked (held by limits), "
                    "suspended (a durable sleep, a signal wait, a join).", ["queue", "state"],
                    registry=REGISTRY)
OLDEST_WAIT = Gauge("jobq_queue_oldest_wait_seconds", "How long the oldest ready job of the "
                    "queue has been due and not started (0: none).", ["queue"],
                    registry=REGISTRY)
SUSPENDED = Gauge("jobq_queue_suspended", "Suspended jobs per queue by what they wait for: "
                  "sleep (job.sleep), signal (job.wait_for), children (job.join); they hold "
                  "no slot and no lease.", ["queue", "reason"], registry=REGISTRY)
OLDEST_SUSPENDED = Gauge("jobq_queue_oldest_suspended_seconds", "How long the queue's "
                         "longest-suspended job has waited (0: none).", ["queue"],
                         registry=REGISTRY)
BACKLOG_SAMPLED = Gauge("jobq_backlog_sampled_timestamp_seconds", "Unix time of this reaper's "
                        "last backlog sample.", registry=REGISTRY)
# The invariant monitor (reaper/audit.py): each violation is counted once,
# by the reaper that recorded it, so alert on sum(increase(...)).
INVARIANT_VIOLATIONS = Counter("jobq_invariant_violations_total", "Jobs found breaking one of "
                               "jobq's invariants (jobq audit prints them), by kind.",
                               ["kind"], registry=REGISTRY)
AUDITED = Gauge("jobq_audit_timestamp_seconds", "Unix time of this reaper's last invariant "
                "check.", registry=REGISTRY)


def exposition() -> bytes:
    return generate_latest(REGISTRY)


async def watch_loop_lag(interval_s: float = 0.25) -> None:
    """Sample event-loop lag forever (cancel to stop)."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(interval_s)
        LOOP_LAG.set(max(0.0, loop.time() - start - interval_s))
