-- Per-key tiers (issue #51, item 5): one key of a queue gets limits of its
-- own over the queue's per-key defaults (an enterprise tenant at 20 running
-- while every other key gets the queue's 2). A tier applies only on a queue
-- with per-key limits (max_running_per_key or rate_per_s_per_key): those are
-- the queues whose claims, admission and unparking count per key, and a tier
-- never turns the lean claim path of an unlimited queue into the full one.
-- jobq keys set Q KEY --max-running N --rate-per-second R writes a row;
-- jobq.queue_delete removes a deleted queue's. Every place a key's room is
-- decided reads the key's limits through jobq.key_tier(queue row, key): the
-- claim (jobq.key_allowance / key_tokens), the reapers' unpark, the
-- admission trigger below. So a tier holds fleet-wide, as the defaults do,
-- and a dead worker's share comes back with its leases (I9).
CREATE TABLE jobq.key_limit (
    queue text NOT NULL CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$'),
    key text NOT NULL CHECK (length(key) BETWEEN 1 AND 1000),
    max_running integer CHECK (max_running BETWEEN 1 AND 1000000),
    rate_per_s double precision CHECK (rate_per_s > 0 AND rate_per_s <= 100000),
    set_at timestamptz NOT NULL DEFAULT now(),
    set_by text NOT NULL DEFAULT session_user,
    PRIMARY KEY (queue, key),
    CHECK (max_running IS NOT NULL OR rate_per_s IS NOT NULL)
);
COMMENT ON TABLE jobq.key_limit IS
    'Per-key tiers: a key''s own max running and rate over its queue''s per-key defaults.';
GRANT SELECT ON jobq.key_limit TO jobq_reader, jobq_reaper;  -- the reapers' unpark reads it

-- The queue's row as one key sees it: its per-key limits replaced by the
-- key's tier, where it has one and the queue limits keys at all.
CREATE FUNCTION jobq.key_tier(q jobq.queue, k text) RETURNS jobq.queue
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t jobq.key_limit;
BEGIN
    IF q.max_running_per_key IS NULL AND q.rate_per_s_per_key IS NULL THEN
        RETURN q;
    END IF;
    SELECT * INTO t FROM jobq.key_limit l WHERE l.queue = q.name AND l.key = k;
    IF FOUND THEN
        q.max_running_per_key := coalesce(t.max_running, q.max_running_per_key);
        q.rate_per_s_per_key := coalesce(t.rate_per_s, q.rate_per_s_per_key);
    END IF;
    RETURN q;
END $$;
REVOKE ALL ON FUNCTION jobq.key_tier(jobq.queue, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.key_tier(jobq.queue, text) TO jobq_reaper;  -- as key_tokens

-- Admission (schema 0015) with the key's tier: parked at insert when the
-- key already has its own cap's worth in line or running.
CREATE OR REPLACE FUNCTION jobq.admit_keyed() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    cap integer;
BEGIN
    SELECT (jobq.key_tier(q, NEW.key)).max_running_per_key INTO cap
    FROM jobq.queue q WHERE q.name = NEW.queue;
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
