-- A job published with both after => and a delay (found by hand: after a
-- 1 s parent, delay_s = 8) was handed to the relay the moment its last
-- parent completed, not when due: the relay published it at 1 s, the
-- consumer dropped the delivery as not due, and only the lost-message check
-- published it again, at 27 s instead of 8. Released, it now waits for
-- the later of now and its own run_at, as any delayed job does (the
-- reapers' probe sleeps until then; the NOTIFY below wakes them to see it).
CREATE OR REPLACE FUNCTION jobq.release_dependants() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    q text;
BEGIN
    -- The dependants' rows, locked in id order first: two parents of the
    -- same jobs ending at once then queue behind each other instead of
    -- locking those rows in two orders (a deadlock).
    PERFORM 1 FROM jobq.job d
    WHERE d.id IN (SELECT dep.job_id FROM jobq.job_dependency dep WHERE dep.parent_id = NEW.id)
    ORDER BY d.id
    FOR NO KEY UPDATE;
    IF NEW.status = 'completed' THEN
        FOR q IN
            WITH released AS (
                UPDATE jobq.job d
                SET waiting_on = d.waiting_on - 1,
                    relay_after = CASE WHEN d.waiting_on = 1 THEN greatest(now(), d.run_at)
                                       ELSE d.relay_after END,
                    published_at = CASE WHEN d.waiting_on = 1 THEN NULL ELSE d.published_at END
                FROM jobq.job_dependency dep
                WHERE dep.parent_id = NEW.id AND d.id = dep.job_id
                  AND d.status = 'queued' AND d.waiting_on > 0
                RETURNING d.queue, d.waiting_on)
            SELECT DISTINCT r.queue FROM released r WHERE r.waiting_on = 0
        LOOP
            PERFORM pg_notify('jobq_relay', q);  -- at commit: the reapers publish it (when due)
        END LOOP;
    ELSE
        UPDATE jobq.job d
        SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL, waiting_on = 0,
            last_error = format('cancelled: job %s it waits for was %s', NEW.id, NEW.status)
        FROM jobq.job_dependency dep
        WHERE dep.parent_id = NEW.id AND d.id = dep.job_id AND d.status = 'queued';
    END IF;
    RETURN NULL;
END $$;
