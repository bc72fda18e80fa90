-- An idle reaper sleeps longer between probes (issue #37: an idle fleet costs
-- the database almost nothing), so a job that becomes due later (enqueued
-- with a delay or a debounce, or a retry set for later) wakes the reapers at
-- commit on channel jobq_delayed: one sleeping past its due time probes again
-- and sleeps until then (reaper/wakes.py). A trigger, so every way a row gets
-- a future run_at says so: jobq.enqueue, jobq.enqueue_many, a failure's
-- retry, whatever comes next. The WHEN clause keeps every other insert and
-- update free of it; the empty payload makes one notification per
-- transaction, however many rows it wrote.
CREATE FUNCTION jobq.notify_delayed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_notify('jobq_delayed', '');
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION jobq.notify_delayed() FROM PUBLIC;

CREATE TRIGGER job_delayed_notify AFTER INSERT OR UPDATE OF run_at ON jobq.job
    FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.run_at > now() AND NEW.relay_after < 'infinity')
    EXECUTE FUNCTION jobq.notify_delayed();
