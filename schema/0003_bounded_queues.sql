-- Bad input never stops work for everyone (issue #13).
--
-- 1. Finite, bounded queue settings. PostgreSQL orders NaN above every number
--    and accepts Infinity, so `lease_s >= 0.5` let `nan`, `inf` and 1e14
--    through, and every claim of that queue then failed with "interval out of
--    range". Upper bounds reject all three. Rows already out of range (they
--    could never be claimed) are reset to the defaults first.
-- 2. Reserved queue names: <namespace>.dead is jobq's own dead-letter queue on
--    the broker; a job queue named "dead" made every relay sweep fail.

UPDATE jobq.queue SET lease_s = 30 WHERE NOT (lease_s BETWEEN 0.5 AND 86400);
UPDATE jobq.queue SET timeout_s = NULL WHERE NOT (timeout_s > 0 AND timeout_s <= 604800);
UPDATE jobq.queue SET backoff_base_s = 1 WHERE NOT (backoff_base_s BETWEEN 0 AND 86400);
UPDATE jobq.queue SET backoff_max_s = 300 WHERE NOT (backoff_max_s BETWEEN 0 AND 2592000);
UPDATE jobq.queue SET stall_cooldown_s = 5 WHERE NOT (stall_cooldown_s BETWEEN 0 AND 86400);
UPDATE jobq.queue SET vanished_grace_s = 2 WHERE NOT (vanished_grace_s > 0 AND vanished_grace_s <= 3600);
UPDATE jobq.queue SET max_stalls = 3 WHERE max_stalls > 10000;
UPDATE jobq.queue SET max_attempts = 5 WHERE max_attempts > 10000;
UPDATE jobq.queue SET max_payload_bytes = 1048576 WHERE max_payload_bytes > 104857600;

ALTER TABLE jobq.queue
    ADD CONSTRAINT queue_lease_s_range CHECK (lease_s BETWEEN 0.5 AND 86400),
    ADD CONSTRAINT queue_timeout_s_range
        CHECK (timeout_s IS NULL OR (timeout_s > 0 AND timeout_s <= 604800)),
    ADD CONSTRAINT queue_backoff_base_s_range CHECK (backoff_base_s BETWEEN 0 AND 86400),
    ADD CONSTRAINT queue_backoff_max_s_range CHECK (backoff_max_s BETWEEN 0 AND 2592000),
    ADD CONSTRAINT queue_stall_cooldown_s_range CHECK (stall_cooldown_s BETWEEN 0 AND 86400),
    ADD CONSTRAINT queue_vanished_grace_s_range
        CHECK (vanished_grace_s > 0 AND vanished_grace_s <= 3600),
    ADD CONSTRAINT queue_max_stalls_range CHECK (max_stalls <= 10000),
    ADD CONSTRAINT queue_max_attempts_range CHECK (max_attempts <= 10000),
    ADD CONSTRAINT queue_max_payload_bytes_range CHECK (max_payload_bytes <= 104857600),
    -- NOT VALID: an existing queue of that name keeps working as it did.
    ADD CONSTRAINT queue_name_not_reserved CHECK (name <> 'dead') NOT VALID;

-- enqueue(): the reserved name gets the same clear error as an invalid one.
CREATE OR REPLACE FUNCTION jobq.enqueue(
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
    IF enqueue.queue = 'dead' AND NOT EXISTS (SELECT 1 FROM jobq.queue qq WHERE qq.name = 'dead') THEN
        RAISE EXCEPTION 'jobq: queue name % is reserved', quote_literal(enqueue.queue)
            USING ERRCODE = '22023',
                  HINT = '<namespace>.dead is jobq''s dead-letter queue; choose another name';
    END IF;
    IF NOT (delay < 31536000) THEN  -- NaN, Infinity, or more than a year
        RAISE EXCEPTION 'jobq: delay_s must be a finite number of seconds under a year, got %',
            enqueue.delay_s USING ERRCODE = '22023', HINT = 'pass delay_s in seconds';
    END IF;
    INSERT INTO jobq.queue (name) VALUES (enqueue.queue) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO q FROM jobq.queue AS qq WHERE qq.name = enqueue.queue;
    IF octet_length(doc::text) > q.max_payload_bytes THEN
        RAISE EXCEPTION 'jobq: payload is % bytes, over the % byte limit of queue %',
            octet_length(doc::text), q.max_payload_bytes, enqueue.queue
            USING ERRCODE = '22001',
                  HINT = 'store large data elsewhere and pass a reference, or raise jobq.queue.max_payload_bytes';
    END IF;
    IF octet_length(enqueue.idempotency_key) > 200 THEN
        RAISE EXCEPTION 'jobq: idempotency key is % bytes, over 200',
            octet_length(enqueue.idempotency_key)
            USING ERRCODE = '22023', HINT = 'use a short key, e.g. a hash of what makes it unique';
    END IF;
    INSERT INTO jobq.job AS j (queue, payload, idempotency_key, run_at, relay_after)
    VALUES (enqueue.queue, doc, enqueue.idempotency_key,
            now() + make_interval(secs => delay),
            -- A delayed job is published by the relay when due; otherwise the
            -- caller may promise to publish it itself within relay_grace_s.
            now() + make_interval(secs => CASE WHEN delay > 0 THEN delay
                                               ELSE least(greatest(coalesce(enqueue.relay_grace_s, 0), 0), 3600) END))
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

-- A reaper whose sweeps keep failing says so where operators look, and a
-- reaper that stopped cleanly leaves (its row made "seconds since sweep"
-- alerts fire after every restart).
ALTER TABLE jobq.reaper
    ADD COLUMN last_error text,
    ADD COLUMN failing_since timestamptz;

CREATE OR REPLACE VIEW jobq.reaper_status AS
SELECT r.reaper_id, r.host, r.pid, r.started_at, r.last_sweep_at, r.sweeps,
       extract(epoch FROM now() - r.last_sweep_at)::float8 AS seconds_since_sweep,
       r.last_error, r.failing_since
FROM jobq.reaper r;
