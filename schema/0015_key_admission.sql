-- Per-key fairness at the door (issue #30). A key with a burst (10,000 jobs
-- of one tenant) used to put every id in the broker; each was delivered
-- and parked by a claim before the next key's first id came out (5,000
-- parked at ~1,000/s: another key's jobs waited 5 s). Now a due keyed job of
-- a queue with max_running_per_key is parked as it is inserted when its key
-- already has that many jobs in line (queued and not held back, or
-- running): it gets no message, only its key's freed slots release it
-- (unpark_freed, the reapers' unpark), so the broker holds about a cap's
-- worth of ids per key and a key with 10 jobs is not behind one with 10,000.
-- Every insert path (jobq.enqueue, jobq.enqueue_many, the workflows') goes
-- through this trigger; its WHEN clause keeps unkeyed jobs out of it. A
-- delayed or debounced job (run_at ahead) is admitted when the relay
-- publishes it and the claim decides.

-- Jobs of a key in line (not parked): the count stops at the cap.
CREATE INDEX job_in_line_key_idx ON jobq.job (queue, key)
    WHERE status = 'queued' AND relay_after < 'infinity' AND key IS NOT NULL;

CREATE FUNCTION jobq.admit_keyed() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    cap integer;
BEGIN
    SELECT q.max_running_per_key INTO cap FROM jobq.queue q WHERE q.name = NEW.queue;
    IF cap IS NOT NULL AND (
           (SELECT count(*) FROM (SELECT 1 FROM jobq.job j
                                  WHERE j.queue = NEW.queue AND j.key = NEW.key
                                    AND j.status = 'queued' AND j.relay_after < 'infinity'
                                  LIMIT cap) AS in_line)
         + (SELECT count(*) FROM (SELECT 1 FROM jobq.job a
                                  WHERE a.queue = NEW.queue AND a.key = NEW.key
                                    AND a.status = 'active'
                                  LIMIT cap) AS running)) >= cap THEN
        -- parked: a spell of its own, so no publish mark of the new row (NULL) covers it
        NEW.relay_after := 'infinity';
        NEW.lock := gen_random_uuid();
    END IF;
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION jobq.admit_keyed() FROM PUBLIC;
CREATE TRIGGER job_admit_keyed
    BEFORE INSERT ON jobq.job
    FOR EACH ROW
    WHEN (NEW.key IS NOT NULL AND NEW.status = 'queued' AND NEW.waiting_on = 0
          AND NEW.run_at <= now() AND NEW.relay_after < 'infinity')
    EXECUTE FUNCTION jobq.admit_keyed();
