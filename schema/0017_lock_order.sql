-- One lock order for every multi-row write (issue #36's deadlock). The
-- batched lease writes now send their rows sorted by id, as the claim locks
-- them (lease.in_lock_order); here the other two writes that lock several
-- job rows by a criterion rather than by a sorted list: the end of a job
-- that others wait for (its dependants) and jobq cancel WORKFLOW_ID.

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
                    relay_after = CASE WHEN d.waiting_on = 1 THEN now() ELSE d.relay_after END,
                    published_at = CASE WHEN d.waiting_on = 1 THEN NULL ELSE d.published_at END
                FROM jobq.job_dependency dep
                WHERE dep.parent_id = NEW.id AND d.id = dep.job_id
                  AND d.status = 'queued' AND d.waiting_on > 0
                RETURNING d.queue, d.waiting_on)
            SELECT DISTINCT r.queue FROM released r WHERE r.waiting_on = 0
        LOOP
            PERFORM pg_notify('jobq_relay', q);  -- at commit: the reapers publish it
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
