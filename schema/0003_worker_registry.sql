-- Fast detection of dead workers, and poison isolation.
--
-- Each consumer process registers here and holds a session-level advisory
-- lock (lock_key) on a dedicated connection for as long as it lives. When the
-- process dies, PostgreSQL ends its session at once and the lock disappears:
-- the reaper sees that within a sweep and shortens that worker's leases to
-- the queue's vanished_grace_s. A vanished session is a hint, not proof (the
-- worker may only have lost its connection), so nothing is reclaimed at once:
-- a live worker reconnects, re-registers and renews within the grace.

CREATE TABLE jobq.worker (
    worker_id    text PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    lock_key     bigint NOT NULL,
    backend_pid  integer,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    vanished_at  timestamptz
);

ALTER TABLE jobq.queue
    ADD COLUMN vanished_grace_s double precision NOT NULL DEFAULT 2
        CHECK (vanished_grace_s > 0);

-- suspect: the job was held by a worker that died holding other jobs too, so
-- it may or may not be the cause. Suspects run alone (their worker takes no
-- other job meanwhile) so that a second crash points at the culprit.
-- stalls counts lapses that are the job's own doing (it was alone, or already
-- a suspect) and drives max_stalls; suspect_stalls counts shared ones.
-- handoffs: times a busy worker passed a suspect on instead of making it wait
-- (bounded, so a suspect does not bounce around a busy fleet).
ALTER TABLE jobq.job
    ADD COLUMN suspect boolean NOT NULL DEFAULT false,
    ADD COLUMN suspect_stalls integer NOT NULL DEFAULT 0,
    ADD COLUMN handoffs integer NOT NULL DEFAULT 0;

ALTER TABLE jobq.job_event DROP CONSTRAINT job_event_event_check;
ALTER TABLE jobq.job_event ADD CONSTRAINT job_event_event_check CHECK (event IN (
    'enqueued', 'published', 'claimed', 'completed', 'retry', 'failed', 'released',
    'stalled', 'lease_lost', 'cancelled', 'retried', 'republished', 'worker_vanished'));

DROP VIEW jobq.stalled_ever;
CREATE VIEW jobq.stalled_ever AS
SELECT id, queue, status, stalls, suspect_stalls, suspect, attempts, errors, worker_id,
       last_error, created_at
FROM jobq.job
WHERE stalls > 0 OR suspect_stalls > 0;

-- Consumers alive right now (their registry session holds its lock).
CREATE VIEW jobq.workers AS
SELECT w.worker_id, w.host, w.pid, w.started_at, w.last_seen_at, w.vanished_at,
       (SELECT count(*) FROM jobq.job j WHERE j.worker_id = w.worker_id
                                          AND j.status = 'active') AS active_jobs
FROM jobq.worker w;
