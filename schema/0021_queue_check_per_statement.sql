-- A job's queue must exist, as long as the job does: the rule of the foreign
-- key job_queue_fkey (0001), kept, checked once per statement instead of
-- once per row (issue #37, bulk enqueue). The key ran its check query for
-- every inserted row: 8.8 of 21 microseconds a row in enqueue_many of 100
-- (bench/README.md). Its row locks stay: an insert takes each of its
-- queues' rows FOR KEY SHARE, so `jobq queue delete` (FOR UPDATE) waits
-- for it or it waits for the delete and then finds the queue gone. The
-- checks run at the end of their statement, as the key's did, and see what
-- committed meanwhile. The functions run as whoever writes: jobq's own
-- inserts come through jobq.enqueue and jobq.enqueue_many (their owner's).
ALTER TABLE jobq.job DROP CONSTRAINT job_queue_fkey;

-- Inserted jobs (any statement, however many rows): their queues, locked.
CREATE FUNCTION jobq.check_new_jobs_queues() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    missing text;
BEGIN
    PERFORM 1 FROM jobq.queue q  -- in name order: one lock order for every writer
    WHERE q.name IN (SELECT DISTINCT n.queue FROM new_jobs n)
    ORDER BY q.name
    FOR KEY SHARE OF q;
    SELECT n.queue INTO missing
    FROM (SELECT DISTINCT queue FROM new_jobs) n
    WHERE NOT EXISTS (SELECT 1 FROM jobq.queue q WHERE q.name = n.queue)
    LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'queue "%" does not exist', missing
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'publish through jobq.enqueue, which creates a queue on first use';
    END IF;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION jobq.check_new_jobs_queues() FROM PUBLIC;

CREATE TRIGGER job_queue_exists AFTER INSERT ON jobq.job
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobq.check_new_jobs_queues();

-- A job moved to another queue (nothing in jobq does; SQL by hand might).
CREATE FUNCTION jobq.check_moved_job_queue() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM 1 FROM jobq.queue q WHERE q.name = NEW.queue FOR KEY SHARE OF q;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue "%" does not exist', NEW.queue
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION jobq.check_moved_job_queue() FROM PUBLIC;

CREATE TRIGGER job_queue_moved AFTER UPDATE OF queue ON jobq.job
    FOR EACH ROW WHEN (OLD.queue IS DISTINCT FROM NEW.queue)
    EXECUTE FUNCTION jobq.check_moved_job_queue();

-- A queue deleted or renamed while a job of it is left.
CREATE FUNCTION jobq.check_queue_unused() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM jobq.job j WHERE j.queue = OLD.name) THEN
        RAISE EXCEPTION 'queue "%" still has jobs', OLD.name
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'jobq queue delete removes a queue with its finished jobs';
    END IF;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION jobq.check_queue_unused() FROM PUBLIC;

CREATE TRIGGER queue_deleted AFTER DELETE ON jobq.queue
    FOR EACH ROW EXECUTE FUNCTION jobq.check_queue_unused();
CREATE TRIGGER queue_renamed AFTER UPDATE OF name ON jobq.queue
    FOR EACH ROW WHEN (OLD.name IS DISTINCT FROM NEW.name)
    EXECUTE FUNCTION jobq.check_queue_unused();

-- TRUNCATE of the queues without the jobs (the key refused it too); after
-- the command, so `TRUNCATE jobq.job, jobq.queue` still works.
CREATE FUNCTION jobq.check_queues_truncated() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM jobq.job) THEN
        RAISE EXCEPTION 'jobq.queue cannot be truncated while jobq.job has rows'
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'TRUNCATE jobq.job and jobq.queue in one command';
    END IF;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION jobq.check_queues_truncated() FROM PUBLIC;

CREATE TRIGGER queue_truncated AFTER TRUNCATE ON jobq.queue
    FOR EACH STATEMENT EXECUTE FUNCTION jobq.check_queues_truncated();
