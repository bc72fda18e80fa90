-- What a suspended job waits for and since when, and who spawned whom
-- (issue #52, item 6).
--
-- job.suspended_at: when its last run ended to wait (the suspend statement).
-- A job is suspended while it is queued, not due, and that moment is after
-- its last start (the claim sets started_at each run), so no later write has
-- to clear it: a retry's backoff after a re-run is "delayed" again. Before
-- this, a durable sleep counted as "delayed": it could not be told from a
-- delay_s or a backoff.
ALTER TABLE jobq.job ADD COLUMN suspended_at timestamptz;
COMMENT ON COLUMN jobq.job.suspended_at IS
    'When its last run ended to wait (job.sleep, job.wait_for, job.join); it waits '
    'while queued, not due and suspended_at > started_at.';

-- The backlog keeps its columns and meaning, except that a durable sleep is
-- now "suspended" (it was "delayed"), and gains the suspended jobs by reason
-- (sleep, signal, children) and the oldest suspension's age: what the reapers
-- export as jobq_queue_suspended{queue,reason} and
-- jobq_queue_oldest_suspended_seconds. A job suspended before this migration
-- (suspended_at NULL) is told by wake_on / joining as before.
CREATE OR REPLACE VIEW jobq.backlog AS
SELECT q.name AS queue,
       count(s.id) FILTER (WHERE s.state = 'ready') AS ready,
       count(s.id) FILTER (WHERE s.state = 'delayed') AS delayed,
       count(s.id) FILTER (WHERE s.state = 'waiting') AS waiting,
       count(s.id) FILTER (WHERE s.state = 'parked') AS parked,
       count(s.id) FILTER (WHERE s.state = 'suspended') AS suspended,
       coalesce(extract(epoch FROM now() - min(s.run_at) FILTER (WHERE s.state = 'ready')),
                0)::float8 AS oldest_ready_s,
       count(s.id) FILTER (WHERE s.state = 'suspended' AND s.reason = 'sleep')
           AS suspended_sleep,
       count(s.id) FILTER (WHERE s.state = 'suspended' AND s.reason = 'signal')
           AS suspended_signal,
       count(s.id) FILTER (WHERE s.state = 'suspended' AND s.reason = 'children')
           AS suspended_children,
       coalesce(extract(epoch FROM now() - min(s.suspended_at)
                                           FILTER (WHERE s.state = 'suspended')),
                0)::float8 AS oldest_suspended_s
FROM jobq.queue q
LEFT JOIN LATERAL (
    SELECT j.id, j.run_at, j.suspended_at,
           CASE WHEN j.waiting_on > 0 THEN 'waiting'
                WHEN j.relay_after = 'infinity' THEN 'parked'
                WHEN j.run_at > now() AND (j.wake_on IS NOT NULL OR j.joining IS NOT NULL
                                           OR j.suspended_at > j.started_at)
                     THEN 'suspended'
                WHEN j.run_at > now() THEN 'delayed'
                ELSE 'ready' END AS state,
           CASE WHEN j.joining IS NOT NULL THEN 'children'
                WHEN j.wake_on IS NOT NULL THEN 'signal'
                ELSE 'sleep' END AS reason
    FROM jobq.job j
    WHERE j.status = 'queued' AND j.queue = q.name
) s ON true
GROUP BY q.name;
COMMENT ON VIEW jobq.backlog IS
    'Queued jobs per queue by state (ready, delayed, waiting, parked, suspended: a '
    'durable sleep, a signal wait, a join), the oldest ready job''s wait in seconds (0: '
    'none), the suspended ones by reason and the oldest suspension''s age. What the '
    'reapers export as jobq_queue_depth{state}, jobq_queue_oldest_wait_seconds, '
    'jobq_queue_suspended{reason} and jobq_queue_oldest_suspended_seconds.';

-- Who spawned a job: its parent's step 'spawn:<name>' (fn jobq.spawn) holds
-- its id. Only spawn steps are in this index, so the job page and the
-- workflow view find a child's parent without reading every step.
CREATE INDEX job_step_spawned_idx ON jobq.job_step ((result #>> '{}'))
    WHERE fn = 'jobq.spawn';

-- A joining job's index holds queued ones only: a cancelled parent keeps its
-- joining list (what it waited for, shown on its page), and in the old index
-- (0029) it kept the reapers' probe saying "a join is pending" forever, so
-- the wake duty ran every sweep after the first cancelled join.
DROP INDEX jobq.job_joining_idx;
CREATE INDEX job_joining_idx ON jobq.job (id) WHERE joining IS NOT NULL AND status = 'queued';
