-- History from the row (issue #16). Every job wrote three history rows on
-- its happy path: 'enqueued', 'claimed' and 'completed', half of the row
-- writes of its life, though the first and the last only repeat what the
-- job's row keeps for good (created_at; status, finished_at, worker_id and
-- attempts of a completed row, which never changes again). jobq.job_event now
-- records what the row does not keep: every claim (who ran which attempt),
-- every failure, stall, release, publish by the relay, retry, cancel, and the
-- delay asked for at enqueue. jobq.history shows the whole story as before,
-- adding 'enqueued' and 'completed' from the row for jobs without such an
-- event (every job from here on; older jobs keep theirs). A happy job's
-- events: 3 rows -> 1.
--
-- The two enqueue functions are their latest definitions (0004, 0009) with
-- only the 'enqueued' event changed; CREATE OR REPLACE resets a function's
-- attributes, so those set by ALTER in 0006 and 0010 are written out here.

CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb DEFAULT '{}'::jsonb,
    delay_s double precision DEFAULT 0,
    idempotency_key text DEFAULT NULL,
    relay_grace_s double precision DEFAULT 0
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

CREATE OR REPLACE FUNCTION jobq.enqueue_many(
    queues text[],
    payloads jsonb[],
    delays_s double precision[] DEFAULT NULL,
    idempotency_keys text[] DEFAULT NULL,
    relay_grace_s double precision DEFAULT 0
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
                    AND octet_length(coalesce(u.payload, '{}'::jsonb)::text) <= q.max_payload_bytes)
    INTO plain
    FROM unnest(enqueue_many.queues, enqueue_many.payloads, enqueue_many.delays_s,
                enqueue_many.idempotency_keys) AS u(queue, payload, delay, key)
    LEFT JOIN jobq.queue q ON q.name = u.queue;
    IF NOT coalesce(plain, false) THEN
        RETURN QUERY
        SELECT u.n, jobq.enqueue(u.queue, u.payload, u.delay, u.key, grace)
        FROM unnest(enqueue_many.queues, enqueue_many.payloads, enqueue_many.delays_s,
                    enqueue_many.idempotency_keys)
             WITH ORDINALITY AS u(queue, payload, delay, key, n)
        ORDER BY u.n;
        RETURN;
    END IF;
    -- The CTE is read twice and calls a volatile function: PostgreSQL
    -- materialises it, so each row's id is drawn once.
    RETURN QUERY
    WITH t AS (
        SELECT u.n, gen_random_uuid() AS id, u.queue, coalesce(u.payload, '{}'::jsonb) AS payload,
               greatest(coalesce(u.delay, 0), 0) AS delay
        FROM unnest(enqueue_many.queues, enqueue_many.payloads, enqueue_many.delays_s)
             WITH ORDINALITY AS u(queue, payload, delay, n)
    ), inserted AS (
        INSERT INTO jobq.job (id, queue, payload, run_at, relay_after)
        SELECT t.id, t.queue, t.payload, now() + make_interval(secs => t.delay),
               -- as in jobq.enqueue: a delayed job is the relay's when due;
               -- otherwise the caller may promise to publish it within grace.
               now() + make_interval(secs => CASE WHEN t.delay > 0 THEN t.delay ELSE grace END)
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

-- The row's own events carry no n: a job's story is ordered by (at, n), as
-- jobq inspect and the dashboard read it, and so is the view itself (for
-- `SELECT * FROM jobq.history WHERE job_id = ...`). 'enqueued' is at
-- created_at, the start of the enqueuing transaction, so before everything
-- else; 'completed' at finished_at, the start of the completing
-- transaction, after its claim.
CREATE OR REPLACE VIEW jobq.history AS
SELECT e.job_id, e.n, e.at, e.event, e.worker_id, e.attempt, e.detail, j.queue
FROM jobq.job_event e
JOIN jobq.job j ON j.id = e.job_id
UNION ALL
SELECT j.id, NULL, j.created_at, 'enqueued', NULL, NULL, NULL, j.queue
FROM jobq.job j
WHERE NOT EXISTS (SELECT 1 FROM jobq.job_event e
                  WHERE e.job_id = j.id AND e.event = 'enqueued')
UNION ALL
SELECT j.id, NULL, j.finished_at, 'completed', j.worker_id, j.attempts, NULL, j.queue
FROM jobq.job j
WHERE j.status = 'completed'
  AND NOT EXISTS (SELECT 1 FROM jobq.job_event e
                  WHERE e.job_id = j.id AND e.event = 'completed')
ORDER BY 3, 2;

COMMENT ON COLUMN jobq.queue.history IS
    'record in jobq.job_event the transitions the job row does not keep; '
    'jobq.history adds enqueued and completed from the row';
