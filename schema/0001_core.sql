-- jobq schema: queues, jobs, job history, reapers, workers, enqueue(), views.
--
-- The job row is the truth. RabbitMQ only carries ids; everything a worker,
-- reaper or operator needs to decide what happens next lives here.

CREATE SCHEMA IF NOT EXISTS jobq;

-- Per-queue settings. Every consumer and reaper reads them from here, so they
-- agree; a change is taken into account from the next claim / sweep on.
CREATE TABLE jobq.queue (
    name              text PRIMARY KEY
                      CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$'),
    lease_s           double precision NOT NULL DEFAULT 30
                      CHECK (lease_s >= 0.5),
    max_stalls        integer NOT NULL DEFAULT 3 CHECK (max_stalls >= 0),
    -- Runs that may end in a handler error before the job fails. Stalls and
    -- releases on shutdown do not count (stalls have max_stalls).
    max_attempts      integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    timeout_s         double precision CHECK (timeout_s IS NULL OR timeout_s > 0),
    backoff_base_s    double precision NOT NULL DEFAULT 1 CHECK (backoff_base_s >= 0),
    backoff_max_s     double precision NOT NULL DEFAULT 300 CHECK (backoff_max_s >= 0),
    -- After the first stall a job is republished at once; each further stall
    -- waits stall_cooldown_s * 2^(stalls-2) so a poison job cannot crash worker
    -- after worker within milliseconds.
    stall_cooldown_s  double precision NOT NULL DEFAULT 5 CHECK (stall_cooldown_s >= 0),
    max_payload_bytes integer NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0),
    -- How short a reaper cuts the leases of a worker whose session ended
    -- (see jobq.worker below).
    vanished_grace_s  double precision NOT NULL DEFAULT 2 CHECK (vanished_grace_s > 0),
    -- Record every transition in jobq.job_event.
    history           boolean NOT NULL DEFAULT true,
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobq.job (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    queue            text NOT NULL REFERENCES jobq.queue (name),
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'active', 'completed', 'failed', 'cancelled')),
    -- Lease: a fresh random token per claim. Every write by a worker is fenced
    -- by (id, lock, status = 'active', lease_expires_at > now()). The token is
    -- kept after completion so a retried completion can recognise itself.
    lock             uuid,
    worker_id        text,
    lease_expires_at timestamptz,
    attempts         integer NOT NULL DEFAULT 0,  -- claims: handler runs started
    errors           integer NOT NULL DEFAULT 0,  -- runs that ended in a handler error
    -- stalls counts lapses that are the job's own doing (it was alone, or
    -- already a suspect) and drives max_stalls; suspect_stalls counts lapses
    -- shared with other jobs of a worker that died holding several. A suspect
    -- runs alone so that a second crash points at the culprit; handoffs counts
    -- times a busy worker passed it on instead of making it wait (bounded).
    stalls           integer NOT NULL DEFAULT 0,
    suspect          boolean NOT NULL DEFAULT false,
    suspect_stalls   integer NOT NULL DEFAULT 0,
    handoffs         integer NOT NULL DEFAULT 0,
    last_error       text,
    idempotency_key  text,
    run_at           timestamptz NOT NULL DEFAULT now(),  -- not claimable before
    -- Publish state is tracked, never assumed: NULL means "no message is known
    -- to carry this id for its current queued spell". relay_after is when the
    -- reaper stops waiting for whoever promised to publish it.
    published_at     timestamptz,
    relay_after      timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
) WITH (fillfactor = 80);  -- room on the page keeps lease renewals HOT

-- No index mentions lease_expires_at, so renewals stay HOT updates.
-- Sweeps scan the active rows only: proportional to what is running.
CREATE INDEX job_active_idx ON jobq.job (queue) WHERE status = 'active';
CREATE INDEX job_unpublished_idx ON jobq.job (relay_after)
    WHERE status = 'queued' AND published_at IS NULL;
CREATE INDEX job_queued_idx ON jobq.job (queue, run_at) WHERE status = 'queued';
CREATE INDEX job_finished_idx ON jobq.job (finished_at)
    WHERE status IN ('completed', 'failed', 'cancelled');
CREATE UNIQUE INDEX job_idempotency_key_idx ON jobq.job (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;


-- Append-only: one row per transition, written in the same statement (and so
-- the same transaction) as the transition itself. No foreign key on purpose:
-- every event is written by the statement that changes its job row, and the
-- key-share lock plus index probe per event made history cost 12-26 % of
-- drain throughput (3 % without; bench/README.md). `jobq prune` deletes a
-- job's events with the job.
CREATE TABLE jobq.job_event (
    n         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    uuid NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    event     text NOT NULL CHECK (event IN (
                  'enqueued', 'published', 'claimed', 'completed', 'retry', 'failed',
                  'released', 'stalled', 'lease_lost', 'cancelled', 'retried',
                  'republished', 'worker_vanished')),
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

-- Fast detection of dead workers. Each consumer process registers here and
-- holds a session-level advisory lock (lock_key) on a dedicated connection
-- for as long as it lives. When the
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

-- enqueue(): the one way a job row is born, from Python or from plain SQL in
-- any language. Unknown queues are created with default settings (as in
-- Celery, BullMQ, Oban and River, a queue is a name). With the defaults the
-- reaper publishes the id (relay_after = now()); the Python producer passes a
-- short grace because it publishes itself right after commit.
CREATE FUNCTION jobq.enqueue(
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
CREATE VIEW jobq.queue_stats AS
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

-- Jobs stalled right now: their worker stopped renewing and the reaper has not
-- requeued them yet.
CREATE VIEW jobq.stalled AS
SELECT id, queue, worker_id, attempts, stalls, lease_expires_at,
       now() - lease_expires_at AS overdue, started_at
FROM jobq.job
WHERE status = 'active' AND lease_expires_at < now();

CREATE VIEW jobq.running AS
SELECT id, queue, worker_id, attempts, stalls, started_at, lease_expires_at
FROM jobq.job
WHERE status = 'active' AND lease_expires_at >= now();

CREATE VIEW jobq.failed AS
SELECT id, queue, attempts, errors, stalls, last_error, finished_at, payload
FROM jobq.job
WHERE status = 'failed';

-- Jobs that ever stalled (their lease lapsed at least once), with the counts.
CREATE VIEW jobq.stalled_ever AS
SELECT id, queue, status, stalls, suspect_stalls, suspect, attempts, errors, worker_id,
       last_error, created_at
FROM jobq.job
WHERE stalls > 0 OR suspect_stalls > 0;

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

-- Consumers alive right now (their registry session holds its lock).
CREATE VIEW jobq.workers AS
SELECT w.worker_id, w.host, w.pid, w.started_at, w.last_seen_at, w.vanished_at,
       (SELECT count(*) FROM jobq.job j WHERE j.worker_id = w.worker_id
                                          AND j.status = 'active') AS active_jobs
FROM jobq.worker w;
