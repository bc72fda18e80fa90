-- What users of Celery, BullMQ, River and Oban reach for next (issue #17):
-- periodic jobs, results, progress and fleet-wide limits per queue.

-- Periodic jobs. A schedule is a cron expression in a time zone, or an
-- interval, for a queue and a payload. next_run_at is the slot due next
-- (database clock). Reapers enqueue a due slot with one conditional
-- statement (schedule_fire in queries.sql): next_run_at must still be that
-- slot, so whatever number of reapers race, one wins; the job's idempotency
-- key 'schedule:<name>:<slot>' is a second lock on the same door. Slots
-- missed while no reaper ran are run once at catch-up, not once each.
CREATE TABLE jobq.schedule (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$'),
    queue       text NOT NULL CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$'),
    payload     jsonb NOT NULL DEFAULT '{}'::jsonb,
    cron        text CHECK (length(cron) <= 200),
    timezone    text NOT NULL DEFAULT 'UTC' CHECK (length(timezone) <= 64),
    interval_s  double precision CHECK (interval_s >= 1 AND interval_s < 31536000),
    next_run_at timestamptz NOT NULL,
    last_slot   timestamptz,
    last_job_id uuid,
    enabled     boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (interval_s IS NULL))
);
CREATE INDEX schedule_due_idx ON jobq.schedule (next_run_at) WHERE enabled;

-- Results and progress, on the row: written by the fenced statements only.
-- watched: somebody waits for this job (client.result, jobq wait); only then
-- does its end send a NOTIFY (NOTIFY serialises commits on a global lock, a
-- price every completion should not pay).
ALTER TABLE jobq.job
    ADD COLUMN result jsonb,
    ADD COLUMN progress jsonb,
    ADD COLUMN progress_at timestamptz,
    ADD COLUMN watched boolean NOT NULL DEFAULT false;

-- Limits, enforced where the claim is decided. max_running: at most this
-- many active jobs of the queue across all consumers. rate_per_s: at most
-- this many starts per second (token bucket, burst = max(1, rate)), kept on
-- the queue row, which a limited claim locks first.
ALTER TABLE jobq.queue
    ADD COLUMN max_result_bytes integer NOT NULL DEFAULT 65536
        CHECK (max_result_bytes BETWEEN 0 AND 104857600),
    ADD COLUMN max_running integer CHECK (max_running BETWEEN 1 AND 1000000),
    ADD COLUMN rate_per_s double precision CHECK (rate_per_s > 0 AND rate_per_s <= 100000),
    ADD COLUMN rate_tokens double precision NOT NULL DEFAULT 1,
    ADD COLUMN rate_at timestamptz NOT NULL DEFAULT now();

CREATE FUNCTION jobq.notify_finished() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_notify('jobq_finished', NEW.id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER job_finished_notify
    AFTER UPDATE OF status ON jobq.job
    FOR EACH ROW
    WHEN (NEW.watched AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION jobq.notify_finished();

CREATE OR REPLACE VIEW jobq.running AS
SELECT id, queue, worker_id, attempts, stalls, started_at, lease_expires_at,
       progress, progress_at
FROM jobq.job
WHERE status = 'active' AND lease_expires_at >= now();

-- Rights (0006's list, kept in tests/integration/test_roles.py): reapers
-- fire schedules (read and advance them, enqueue the job) and release jobs
-- parked by a limit; the reader sees the new table through 0006's default
-- privileges.
GRANT SELECT, UPDATE ON jobq.schedule TO jobq_reaper;
GRANT EXECUTE ON FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision)
    TO jobq_reaper;
