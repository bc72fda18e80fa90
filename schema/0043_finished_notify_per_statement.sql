-- A job's end NOTIFYs its waiters once per statement, not once per row
-- (issue #49). The row trigger of schema 0024 ran a plpgsql call and a
-- probe of jobq.job_watch for every job that finished: ~0.04 ms of the
-- completion's ~0.09 ms a job (bench/claim_cost.py), with nobody waiting
-- on almost all of them. A statement trigger sees the statement's rows as a
-- transition table and probes jobq.job_watch once for all of them.
--
-- A transition table cannot go with a column list, so it runs after every
-- UPDATE of jobq.job and keeps only rows now finished that a waiter
-- watches. A finished row written again (rare: a dependency settled) may
-- NOTIFY its waiter a second time; the waiter re-reads the row, which is
-- the truth (results.py), so a second NOTIFY is harmless. The waiter still
-- never writes the job row (I11).
CREATE OR REPLACE FUNCTION jobq.notify_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    PERFORM pg_notify('jobq_finished', f.id::text)
    FROM finished f
    WHERE f.status IN ('completed', 'failed', 'cancelled')
      AND EXISTS (SELECT 1 FROM jobq.job_watch w WHERE w.job_id = f.id);
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobq.notify_finished() FROM PUBLIC;

DROP TRIGGER job_finished_notify ON jobq.job;
CREATE TRIGGER job_finished_notify AFTER UPDATE ON jobq.job
    REFERENCING NEW TABLE AS finished
    FOR EACH STATEMENT
    EXECUTE FUNCTION jobq.notify_finished();
