-- Backlog you can alert on (issue #50, item 5): a queued job is in exactly
-- one of five states, and only "ready" is work a consumer could start now.
-- Before this, a job waiting for its parents, a parked one (held by a
-- queue's limits) and a suspended one (job.wait_for / job.join) all counted
-- as "queued" and pushed "oldest wait" up, so an alert on it fired for jobs
-- that were waiting as designed.
--
--   waiting    published `after` others that have not all ended (waiting_on > 0)
--   parked     held by the queue's or its key's limits (relay_after 'infinity')
--   suspended  waits for a signal or its children (wake_on / joining), not due yet
--   delayed    not due yet (delay_s, a retry's backoff, a snooze, job.sleep)
--   ready      due and free to start
--
-- jobq.backlog reads queued rows only (job_queued_idx: status = 'queued'),
-- so its cost follows the backlog, never the finished rows kept.
CREATE VIEW jobq.backlog AS
SELECT q.name AS queue,
       count(s.id) FILTER (WHERE s.state = 'ready') AS ready,
       count(s.id) FILTER (WHERE s.state = 'delayed') AS delayed,
       count(s.id) FILTER (WHERE s.state = 'waiting') AS waiting,
       count(s.id) FILTER (WHERE s.state = 'parked') AS parked,
       count(s.id) FILTER (WHERE s.state = 'suspended') AS suspended,
       coalesce(extract(epoch FROM now() - min(s.run_at) FILTER (WHERE s.state = 'ready')),
                0)::float8 AS oldest_ready_s
FROM jobq.queue q
LEFT JOIN LATERAL (
    SELECT j.id, j.run_at,
           CASE WHEN j.waiting_on > 0 THEN 'waiting'
                WHEN j.relay_after = 'infinity' THEN 'parked'
                WHEN (j.wake_on IS NOT NULL OR j.joining IS NOT NULL) AND j.run_at > now()
                     THEN 'suspended'
                WHEN j.run_at > now() THEN 'delayed'
                ELSE 'ready' END AS state
    FROM jobq.job j
    WHERE j.status = 'queued' AND j.queue = q.name
) s ON true
GROUP BY q.name;
COMMENT ON VIEW jobq.backlog IS
    'Queued jobs per queue by state (ready, delayed, waiting, parked, suspended) and '
    'the oldest ready job''s wait in seconds (0: none). What the reapers export as '
    'jobq_queue_depth{state} and jobq_queue_oldest_wait_seconds.';
GRANT SELECT ON jobq.backlog TO jobq_reader, jobq_reaper;

-- queue_stats keeps its columns (queued now means ready: what a consumer
-- could start) and gains the three kinds of waiting at the end.
CREATE OR REPLACE VIEW jobq.queue_stats AS
SELECT q.name AS queue,
       coalesce(b.ready, 0) AS queued,
       coalesce(b.delayed, 0) AS delayed,
       count(j.id) FILTER (WHERE j.status = 'active' AND j.lease_expires_at >= now()) AS running,
       count(j.id) FILTER (WHERE j.status = 'active' AND j.lease_expires_at < now()) AS stalled,
       count(j.id) FILTER (WHERE j.status = 'completed') AS completed,
       count(j.id) FILTER (WHERE j.status = 'failed') AS failed,
       count(j.id) FILTER (WHERE j.status = 'cancelled') AS cancelled,
       CASE WHEN coalesce(b.ready, 0) > 0 THEN make_interval(secs => b.oldest_ready_s) END
           AS oldest_queued_age,
       count(j.id) FILTER (WHERE j.status = 'completed'
                           AND j.finished_at > now() - interval '1 minute')
           AS completed_last_minute,
       q.paused,
       coalesce(b.waiting, 0) AS waiting,
       coalesce(b.parked, 0) AS parked,
       coalesce(b.suspended, 0) AS suspended
FROM jobq.queue q
LEFT JOIN jobq.backlog b ON b.queue = q.name
LEFT JOIN jobq.job j ON j.queue = q.name AND j.status <> 'queued'
GROUP BY q.name, q.paused, b.ready, b.delayed, b.oldest_ready_s, b.waiting, b.parked,
         b.suspended;
