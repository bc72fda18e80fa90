-- Flow control (issue #30): priorities, per-key caps and rates with
-- fairness between keys, pause, debounce. Every limit is decided where the
-- claim is (queries.sql, claim), so it holds whatever the number of
-- consumers, and a dead worker's share comes back with its leases.

-- priority: 0..9, higher first, default 0. key: who the job is for (a
-- tenant, a customer); jobs without one are unkeyed and mix with keyed ones
-- in a queue. Both are written once, at enqueue. NOT VALID: the rows already
-- there hold 0 and NULL.
ALTER TABLE jobq.job
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN key text;
ALTER TABLE jobq.job
    ADD CONSTRAINT job_priority_range CHECK (priority BETWEEN 0 AND 9) NOT VALID,
    ADD CONSTRAINT job_key_length CHECK (octet_length(key) BETWEEN 1 AND 200) NOT VALID;

-- max_running_per_key: at most this many jobs of one key run at once across
-- the fleet. rate_per_s_per_key: at most this many starts per second for
-- each key (a token bucket per key, in jobq.key_rate). paused: no job of
-- the queue starts; publishing goes on, deliveries are parked, resume
-- releases them.
ALTER TABLE jobq.queue
    ADD COLUMN max_running_per_key integer CHECK (max_running_per_key BETWEEN 1 AND 1000000),
    ADD COLUMN rate_per_s_per_key double precision
        CHECK (rate_per_s_per_key > 0 AND rate_per_s_per_key <= 100000),
    ADD COLUMN paused boolean NOT NULL DEFAULT false;

-- The claim looks for waiting jobs of a higher priority than the one it was
-- handed: only jobs with a priority above 0 are in this index, so a queue
-- that uses none pays one probe of an empty index per claim batch. Its
-- status test is written COLLATE "C", as the claim's is: no other partial
-- index of queued rows can then serve the claim's probe, whatever the
-- statistics say when its one generic plan is made (test_plans.py).
CREATE INDEX job_priority_idx ON jobq.job (queue, priority DESC, id)
    WHERE status COLLATE "C" = 'queued' AND priority > 0;
-- How many jobs of one key run now (per-key caps), and which jobs of a key
-- wait (debounce, jobq.key_stats): keyed rows only.
CREATE INDEX job_active_key_idx ON jobq.job (queue, key)
    WHERE status = 'active' AND key IS NOT NULL;
CREATE INDEX job_queued_key_idx ON jobq.job (queue, key, run_at)
    WHERE status = 'queued' AND key IS NOT NULL;
-- Parked jobs (held back by a limit or a pause), best first per key.
CREATE INDEX job_parked_idx ON jobq.job (queue, key, priority DESC, run_at, id)
    WHERE status = 'queued' AND relay_after = 'infinity';

-- One token bucket per (queue, key) with a per-key rate; the claim that
-- spends tokens holds that key's advisory lock. Rows idle for an hour are
-- pruned by the reapers (a full bucket is the same as no row).
CREATE TABLE jobq.key_rate (
    queue  text NOT NULL,
    key    text NOT NULL,
    tokens double precision NOT NULL,
    at     timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);
GRANT SELECT, DELETE ON jobq.key_rate TO jobq_reaper;

-- A paused queue lets nothing start: its allowance is 0 (0010's function
-- with the pause added; callers, the claim and the reapers' unpark, lock or
-- read the queue row).
CREATE OR REPLACE FUNCTION jobq.allowance(q jobq.queue, active bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN q.paused THEN 0 ELSE
        greatest(0, least(coalesce(q.max_running - active, 2147483647),
                          coalesce(floor(jobq.rate_tokens(q))::bigint, 2147483647))) END
$$;

-- One key's allowance: free per-key slots and whole per-key rate tokens,
-- the smaller (each absent limit: no bound). tokens: jobq.key_tokens.
CREATE FUNCTION jobq.key_tokens(q jobq.queue, tokens double precision, at timestamptz)
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN q.rate_per_s_per_key IS NOT NULL THEN
        least(greatest(q.rate_per_s_per_key, 1),
              coalesce(tokens + q.rate_per_s_per_key * extract(epoch FROM now() - at),
                       greatest(q.rate_per_s_per_key, 1))) END
$$;
CREATE FUNCTION jobq.key_allowance(q jobq.queue, active bigint, tokens double precision)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT greatest(0, least(coalesce(q.max_running_per_key - active, 2147483647),
                             coalesce(floor(tokens)::bigint, 2147483647)))
$$;
REVOKE ALL ON FUNCTION jobq.key_tokens(jobq.queue, double precision, timestamptz),
                       jobq.key_allowance(jobq.queue, bigint, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.key_tokens(jobq.queue, double precision, timestamptz),
                          jobq.key_allowance(jobq.queue, bigint, double precision)
    TO jobq_reaper;

-- Per key, at a glance: what waits, what runs, how long the oldest waited.
CREATE VIEW jobq.key_stats AS
SELECT queue, key,
       count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'active') AS running,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'queued'
                                                      AND run_at <= now()))::float8
           AS oldest_wait_s
FROM jobq.job
WHERE key IS NOT NULL AND status IN ('queued', 'active')
GROUP BY queue, key;

-- queue_stats shows a paused queue as paused (the column is added last).
CREATE OR REPLACE VIEW jobq.queue_stats AS
SELECT q.name AS queue,
       count(j.id) FILTER (WHERE j.status = 'queued' AND j.run_at <= now()) AS queued,
       count(j.id) FILTER (WHERE j.status = 'queued' AND j.run_at > now())  AS delayed,
       count(j.id) FILTER (WHERE j.status = 'active' AND j.lease_expires_at >= now()) AS running,
       count(j.id) FILTER (WHERE j.status = 'active' AND j.lease_expires_at < now())  AS stalled,
       count(j.id) FILTER (WHERE j.status = 'completed') AS completed,
       count(j.id) FILTER (WHERE j.status = 'failed')    AS failed,
       count(j.id) FILTER (WHERE j.status = 'cancelled') AS cancelled,
       max(now() - j.run_at) FILTER (WHERE j.status = 'queued' AND j.run_at <= now()) AS oldest_queued_age,
       count(j.id) FILTER (WHERE j.status = 'completed'
                             AND j.finished_at > now() - interval '1 minute') AS completed_last_minute,
       q.paused
FROM jobq.queue q
LEFT JOIN jobq.job j ON j.queue = q.name
GROUP BY q.name, q.paused;

-- jobq.enqueue and jobq.enqueue_many gain priority, key and debounce_s
-- (defaults keep every earlier call, named or positional, meaning what it
-- meant). A new argument list is a new function: the old ones are dropped
-- and the grants of 0006, 0007 and 0009 given again.
DROP FUNCTION jobq.enqueue_many(text[], jsonb[], double precision[], text[], double precision);
DROP FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision);

-- 0012's jobq.enqueue, plus:
--   priority (0..9) and key (1..200 bytes) stored on the row;
--   debounce_s > 0 (with a key): the job waits debounce_s; a later enqueue
--   of the same queue and key within that time replaces its payload and
--   pushes its start to debounce_s after itself, so a burst runs once, with
--   the last payload. Only a job nobody published yet is replaced (not due,
--   so no message is out); one that is due or running is left alone and a
--   new one waits. Enqueues of one key take turns (an advisory lock), so two
--   at once never make two pending jobs.
CREATE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb DEFAULT '{}'::jsonb,
    delay_s double precision DEFAULT 0,
    idempotency_key text DEFAULT NULL,
    relay_grace_s double precision DEFAULT 0,
    priority integer DEFAULT 0,
    key text DEFAULT NULL,
    debounce_s double precision DEFAULT 0
) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
-- Parameters are always written enqueue.<name>: "queue" alone would be the
-- whole-row value of table jobq.queue.
DECLARE
    q jobq.queue;
    lim jobq.queue_limits;
    doc jsonb := coalesce(enqueue.payload, '{}'::jsonb);
    delay double precision := greatest(coalesce(enqueue.delay_s, 0), 0);
    debounce double precision := coalesce(enqueue.debounce_s, 0);
    slot_key boolean := enqueue.idempotency_key LIKE 'schedule:%';
    new_id uuid;
    owner_login text;
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
    IF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 0 AND 9 THEN
        RAISE EXCEPTION 'jobq: priority must be 0 to 9, got %', quote_nullable(enqueue.priority)
            USING ERRCODE = '22023', HINT = 'higher runs first; the default is 0';
    END IF;
    IF octet_length(enqueue.key) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'jobq: key is % bytes; use 1 to 200', octet_length(enqueue.key)
            USING ERRCODE = '22023', HINT = 'a tenant or customer id, or a hash of one';
    END IF;
    IF NOT (debounce >= 0 AND debounce < 31536000) THEN
        RAISE EXCEPTION 'jobq: debounce_s must be a finite number of seconds under a year, got %',
            enqueue.debounce_s USING ERRCODE = '22023', HINT = 'pass debounce_s in seconds';
    END IF;
    IF debounce > 0 AND (enqueue.key IS NULL OR enqueue.idempotency_key IS NOT NULL) THEN
        RAISE EXCEPTION 'jobq: debounce_s needs a key (what the jobs collapse on) and no idempotency key'
            USING ERRCODE = '22023', HINT = 'pass key => ''...''';
    END IF;
    IF slot_key AND NOT (pg_has_role(session_user, 'jobq_reaper', 'MEMBER')
                         OR pg_has_role(session_user, 'jobq_owner', 'MEMBER')) THEN
        RAISE EXCEPTION 'jobq: idempotency keys starting with "schedule:" are reserved for '
                        'periodic jobs' USING ERRCODE = '23514',
                  HINT = 'choose another key';
    END IF;
    SELECT * INTO q FROM jobq.queue AS qq WHERE qq.name = enqueue.queue;
    IF NOT FOUND THEN
        -- A new queue: created with defaults, unless auto-creation is off or
        -- the number of queues reached its cap (each is a durable broker queue
        -- that is never removed; one statement once made 200 of them).
        SELECT * INTO lim FROM jobq.queue_limits;
        IF NOT lim.auto_create THEN
            RAISE EXCEPTION 'jobq: queue % does not exist and queues are not created on first use',
                quote_literal(enqueue.queue) USING ERRCODE = '22023',
                HINT = 'create it with jobq queue set, or UPDATE jobq.queue_limits SET auto_create = true';
        END IF;
        IF (SELECT count(*) FROM jobq.queue) >= lim.max_queues THEN
            RAISE EXCEPTION 'jobq: queue % would be queue number % over the cap of %',
                quote_literal(enqueue.queue), lim.max_queues + 1, lim.max_queues
                USING ERRCODE = '22023',
                HINT = 'UPDATE jobq.queue_limits SET max_queues = ..., or reuse a queue';
        END IF;
        INSERT INTO jobq.queue (name) VALUES (enqueue.queue) ON CONFLICT (name) DO NOTHING;
        SELECT * INTO q FROM jobq.queue AS qq WHERE qq.name = enqueue.queue;
    END IF;
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
    IF debounce > 0 THEN
        PERFORM pg_advisory_xact_lock(hashtext(enqueue.queue), hashtext(enqueue.key));
        UPDATE jobq.job AS j
        SET payload = doc, run_at = now() + make_interval(secs => debounce),
            relay_after = now() + make_interval(secs => debounce), priority = enqueue.priority
        WHERE j.id = (SELECT jj.id FROM jobq.job AS jj
                      WHERE jj.queue = enqueue.queue AND jj.key = enqueue.key
                        AND jj.status = 'queued' AND jj.run_at > now()
                        AND jj.published_at IS NULL AND jj.relay_after < 'infinity'
                      ORDER BY jj.run_at DESC LIMIT 1
                      FOR UPDATE)
        RETURNING j.id INTO new_id;
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
        delay := greatest(delay, debounce);
    END IF;
    INSERT INTO jobq.job AS j (queue, payload, idempotency_key, run_at, relay_after, enqueued_by,
                               priority, key)
    VALUES (enqueue.queue, doc, enqueue.idempotency_key,
            now() + make_interval(secs => delay),
            -- A delayed job is published by the relay when due; otherwise the
            -- caller may promise to publish it itself within relay_grace_s.
            now() + make_interval(secs => CASE WHEN delay > 0 THEN delay
                                               ELSE least(greatest(coalesce(enqueue.relay_grace_s, 0), 0), 3600) END),
            CASE WHEN enqueue.idempotency_key IS NOT NULL THEN session_user::text END,
            enqueue.priority, enqueue.key)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT jj.id, jj.enqueued_by INTO new_id, owner_login FROM jobq.job AS jj
        WHERE jj.queue = enqueue.queue AND jj.idempotency_key = enqueue.idempotency_key;
        -- Another login's key: say so, but not which job it is (its id
        -- would let this login read that job's result).
        IF NOT slot_key AND owner_login IS DISTINCT FROM session_user::text
           AND owner_login IS NOT NULL THEN
            RAISE EXCEPTION 'jobq: idempotency key already used in queue % by another login',
                enqueue.queue USING ERRCODE = '23505',
                HINT = 'idempotency keys are per producer login: choose another key';
        END IF;
        RETURN new_id;
    END IF;
    IF q.history AND delay > 0 THEN  -- the row keeps created_at, not the delay asked for
        INSERT INTO jobq.job_event (job_id, event, detail)
        VALUES (new_id, 'enqueued', format('run in %ss', delay));
    END IF;
    IF delay = 0 AND coalesce(enqueue.relay_grace_s, 0) = 0 THEN
        -- Wake the reapers: nobody else will publish this id. NOTIFY is
        -- delivered at commit, so a rolled-back enqueue wakes nobody.
        PERFORM pg_notify('jobq_relay', enqueue.queue);
    END IF;
    RETURN new_id;
END;
$$;

-- 0011's jobq.enqueue_many, plus priorities and keys in the plain path;
-- a debounced row (or any with an idempotency key) goes through jobq.enqueue.
CREATE FUNCTION jobq.enqueue_many(
    queues text[],
    payloads jsonb[],
    delays_s double precision[] DEFAULT NULL,
    idempotency_keys text[] DEFAULT NULL,
    relay_grace_s double precision DEFAULT 0,
    priorities integer[] DEFAULT NULL,
    keys text[] DEFAULT NULL,
    debounces_s double precision[] DEFAULT NULL
) RETURNS TABLE (n bigint, id uuid)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
    grace double precision := least(greatest(coalesce(enqueue_many.relay_grace_s, 0), 0), 3600);
    plain boolean;
BEGIN
    IF coalesce(cardinality(enqueue_many.queues), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT bool_and(q.name IS NOT NULL AND u.key IS NULL
                    AND coalesce(u.delay, 0) < 31536000
                    AND coalesce(u.debounce, 0) = 0
                    AND coalesce(u.priority, 0) BETWEEN 0 AND 9
                    AND (u.jkey IS NULL OR octet_length(u.jkey) BETWEEN 1 AND 200)
                    AND octet_length(coalesce(u.payload, '{}'::jsonb)::text) <= q.max_payload_bytes)
    INTO plain
    FROM unnest(enqueue_many.queues, enqueue_many.payloads, enqueue_many.delays_s,
                enqueue_many.idempotency_keys, enqueue_many.priorities, enqueue_many.keys,
                enqueue_many.debounces_s) AS u(queue, payload, delay, key, priority, jkey, debounce)
    LEFT JOIN jobq.queue q ON q.name = u.queue;
    IF NOT coalesce(plain, false) THEN
        RETURN QUERY
        SELECT u.n, jobq.enqueue(u.queue, u.payload, u.delay, u.key, grace,
                                 coalesce(u.priority, 0), u.jkey, coalesce(u.debounce, 0))
        FROM unnest(enqueue_many.queues, enqueue_many.payloads, enqueue_many.delays_s,
                    enqueue_many.idempotency_keys, enqueue_many.priorities, enqueue_many.keys,
                    enqueue_many.debounces_s)
             WITH ORDINALITY AS u(queue, payload, delay, key, priority, jkey, debounce, n)
        ORDER BY u.n;
        RETURN;
    END IF;
    -- The CTE is read twice and calls a volatile function: PostgreSQL
    -- materialises it, so each row's id is drawn once.
    RETURN QUERY
    WITH t AS (
        SELECT u.n, gen_random_uuid() AS id, u.queue, coalesce(u.payload, '{}'::jsonb) AS payload,
               greatest(coalesce(u.delay, 0), 0) AS delay, coalesce(u.priority, 0) AS priority,
               u.jkey
        FROM unnest(enqueue_many.queues, enqueue_many.payloads, enqueue_many.delays_s,
                    enqueue_many.priorities, enqueue_many.keys)
             WITH ORDINALITY AS u(queue, payload, delay, priority, jkey, n)
    ), inserted AS (
        INSERT INTO jobq.job (id, queue, payload, run_at, relay_after, priority, key)
        SELECT t.id, t.queue, t.payload, now() + make_interval(secs => t.delay),
               -- as in jobq.enqueue: a delayed job is the relay's when due;
               -- otherwise the caller may promise to publish it within grace.
               now() + make_interval(secs => CASE WHEN t.delay > 0 THEN t.delay ELSE grace END),
               t.priority, t.jkey
        FROM t ORDER BY t.n
        RETURNING 1
    ), events AS (
        INSERT INTO jobq.job_event (job_id, event, detail)
        SELECT t.id, 'enqueued', format('run in %ss', t.delay)
        FROM t JOIN jobq.queue q ON q.name = t.queue
        WHERE q.history AND t.delay > 0
        RETURNING 1
    )
    SELECT t.n, t.id FROM t ORDER BY t.n;
    IF grace = 0 THEN
        -- Nobody promised to publish these: wake the reapers (at commit).
        PERFORM pg_notify('jobq_relay', d.queue)
        FROM (SELECT DISTINCT u.queue FROM unnest(enqueue_many.queues, enqueue_many.delays_s)
              AS u(queue, delay) WHERE coalesce(u.delay, 0) <= 0) AS d;
    END IF;
END;
$$;

REVOKE ALL ON FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision,
                                    integer, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision,
                                       integer, text, double precision)
    TO jobq_producer, jobq_reaper;
REVOKE ALL ON FUNCTION jobq.enqueue_many(text[], jsonb[], double precision[], text[],
                                         double precision, integer[], text[],
                                         double precision[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.enqueue_many(text[], jsonb[], double precision[], text[],
                                            double precision, integer[], text[],
                                            double precision[]) TO jobq_producer;
