-- Job history, reaper heartbeats, cancellation, and the views that answer
-- "what is queued, running, stalled right now, failed — and why did this job
-- run twice?" from SQL alone.

-- Per-queue switch for history (on by default; measured cost in bench/).
ALTER TABLE jobq.queue ADD COLUMN history boolean NOT NULL DEFAULT true;

-- Append-only: one row per transition, written in the same statement (and so
-- the same transaction) as the transition itself. No foreign key on purpose:
-- every event is written by the statement that changes its job row, and a
-- key-share lock plus an index probe per event cost ~5 % of throughput;
-- `jobq prune` deletes a job's events with the job.
CREATE TABLE jobq.job_event (
    n         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    uuid NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    event     text NOT NULL CHECK (event IN (
                  'enqueued', 'published', 'claimed', 'completed', 'retry', 'failed',
                  'released', 'stalled', 'lease_lost', 'cancelled', 'retried',
                  'republished')),
    worker_id text,
    attempt   integer,
    detail    text
);
CREATE INDEX job_event_job_idx ON jobq.job_event (job_id, n);

-- Every reaper records its last sweep, so a stopped reaper is an alert.
CREATE TABLE jobq.reaper (
    reaper_id     text PRIMARY KEY,
    host          text NOT NULL,
    pid           integer NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    last_sweep_at timestamptz,
    sweeps        bigint NOT NULL DEFAULT 0
);

-- enqueue() now records the 'enqueued' event.
CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb DEFAULT '{}'::jsonb,
    delay_s double precision DEFAULT 0,
    idempotency_key text DEFAULT NULL,
    relay_grace_s double precision DEFAULT 0
) RETURNS uuid
LANGUAGE plpgsql AS $$
#variable_conflict use_column
-- Parameters are always written enqueue.<name>: "queue" alone would be the
-- whole-row value of table jobq.queue.
DECLARE
    q jobq.queue;
    doc jsonb := coalesce(enqueue.payload, '{}'::jsonb);
    delay double precision := greatest(coalesce(enqueue.delay_s, 0), 0);
    new_id uuid;
BEGIN
    IF enqueue.queue IS NULL OR enqueue.queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$' THEN
        RAISE EXCEPTION 'jobq: invalid queue name %', quote_nullable(enqueue.queue)
            USING ERRCODE = '22023',
                  HINT = 'use 1-100 characters: letters, digits, _ . : - (first a letter or digit)';
    END IF;
    INSERT INTO jobq.queue (name) VALUES (enqueue.queue) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO q FROM jobq.queue AS qq WHERE qq.name = enqueue.queue;
    IF octet_length(doc::text) > q.max_payload_bytes THEN
        RAISE EXCEPTION 'jobq: payload is % bytes, over the % byte limit of queue %',
            octet_length(doc::text), q.max_payload_bytes, enqueue.queue
            USING ERRCODE = '22001',
                  HINT = 'store large data elsewhere and pass a reference, or raise jobq.queue.max_payload_bytes';
    END IF;
    INSERT INTO jobq.job AS j (queue, payload, idempotency_key, run_at, relay_after)
    VALUES (enqueue.queue, doc, enqueue.idempotency_key,
            now() + make_interval(secs => delay),
            -- A delayed job is published by the relay when due; otherwise the
            -- caller may promise to publish it itself within relay_grace_s.
            now() + make_interval(secs => CASE WHEN delay > 0 THEN delay
                                               ELSE coalesce(enqueue.relay_grace_s, 0) END))
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT jj.id INTO new_id FROM jobq.job AS jj
        WHERE jj.queue = enqueue.queue AND jj.idempotency_key = enqueue.idempotency_key;
        RETURN new_id;
    END IF;
    IF q.history THEN
        INSERT INTO jobq.job_event (job_id, event, detail)
        VALUES (new_id, 'enqueued', CASE WHEN delay > 0 THEN format('run in %ss', delay) END);
    END IF;
    IF delay = 0 AND coalesce(enqueue.relay_grace_s, 0) = 0 THEN
        -- Wake the reapers: nobody else will publish this id. NOTIFY is
        -- delivered at commit, so a rolled-back enqueue wakes nobody.
        PERFORM pg_notify('jobq_relay', enqueue.queue);
    END IF;
    RETURN new_id;
END;
$$;

-- Per queue at a glance. "stalled" = active rows whose lease already lapsed
-- and that no reaper requeued yet: a stalled job looks like a running one
-- anywhere else.
CREATE OR REPLACE VIEW jobq.queue_stats AS
SELECT q.name AS queue,
       count(j.id) FILTER (WHERE j.status = 'queued' AND j.run_at <= now()) AS queued,
       count(j.id) FILTER (WHERE j.status = 'queued' AND j.run_at > now())  AS delayed,
       count(j.id) FILTER (WHERE j.status = 'active' AND j.lease_expires_at >= now()) AS running,
       count(j.id) FILTER (WHERE j.status = 'active' AND j.lease_expires_at < now())  AS stalled,
       count(j.id) FILTER (WHERE j.status = 'completed') AS completed,
       count(j.id) FILTER (WHERE j.status = 'failed')    AS failed,
       count(j.id) FILTER (WHERE j.status = 'cancelled') AS cancelled,
       max(now() - j.run_at) FILTER (WHERE j.status = 'queued' AND j.run_at <= now()) AS oldest_queued_age,
       count(j.id) FILTER (WHERE j.status = 'completed'
                             AND j.finished_at > now() - interval '1 minute') AS completed_last_minute
FROM jobq.queue q
LEFT JOIN jobq.job j ON j.queue = q.name
GROUP BY q.name;

-- Jobs that ever stalled (their lease lapsed at least once), with the count.
CREATE VIEW jobq.stalled_ever AS
SELECT id, queue, status, stalls, attempts, errors, worker_id, last_error, created_at
FROM jobq.job
WHERE stalls > 0;

-- Monitor the monitor: every reaper's last sweep, and leases that are due but
-- not reaped. Alert when seconds_since_sweep grows or overdue_leases > 0 for
-- longer than a sweep.
CREATE VIEW jobq.reaper_status AS
SELECT r.reaper_id, r.host, r.pid, r.started_at, r.last_sweep_at, r.sweeps,
       extract(epoch FROM now() - r.last_sweep_at)::float8 AS seconds_since_sweep
FROM jobq.reaper r;

CREATE VIEW jobq.overdue AS
SELECT count(*) AS overdue_leases,
       coalesce(extract(epoch FROM now() - min(lease_expires_at)), 0)::float8 AS oldest_overdue_s,
       (SELECT max(last_sweep_at) FROM jobq.reaper) AS last_sweep_at
FROM jobq.job
WHERE status = 'active' AND lease_expires_at < now();

-- A job's story, oldest first.
CREATE VIEW jobq.history AS
SELECT e.job_id, e.n, e.at, e.event, e.worker_id, e.attempt, e.detail, j.queue
FROM jobq.job_event e
JOIN jobq.job j ON j.id = e.job_id;
