-- A latest job's older pending jobs are cancelled within a sweep (issue
-- #51.1), not only when one would start: a delayed or parked older job
-- stayed "queued" until it came due. The producer of the newer job must not
-- write them (a claim may hold one: I11), so an insert of a latest job notes
-- its key in jobq.latest_key (a row of the key, never a job row), and the
-- reapers' supersede duty cancels the key's queued jobs older than its
-- newest, skipping any row another transaction holds (the claim that holds
-- it cancels it itself: it checks for a newer job). A running one is left to
-- its own worker's renewal, as before.
CREATE TABLE jobq.latest_key (
    queue text NOT NULL,
    key text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);
COMMENT ON TABLE jobq.latest_key IS
    'Keys of latest queues that got a new job since the reapers last looked (schema 0042)';
GRANT SELECT ON jobq.latest_key TO jobq_reader;
-- UPDATE: the duty locks the rows it takes (FOR UPDATE SKIP LOCKED), which
-- needs it; it never updates one.
GRANT SELECT, UPDATE, DELETE ON jobq.latest_key TO jobq_reaper;

-- Runs as whoever inserts the job: the enqueue functions (their owner).
CREATE FUNCTION jobq.note_latest_key() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO jobq.latest_key (queue, key) VALUES (NEW.queue, NEW.key)
    ON CONFLICT (queue, key) DO NOTHING;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION jobq.note_latest_key() FROM PUBLIC;

CREATE TRIGGER job_latest_key AFTER INSERT ON jobq.job
    FOR EACH ROW WHEN (NEW.key_policy = 'latest')
    EXECUTE FUNCTION jobq.note_latest_key();
