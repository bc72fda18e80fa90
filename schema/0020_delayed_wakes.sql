-- An idle reaper sleeps longer between probes (issue #37: an idle fleet costs
-- the database almost nothing), so a job enqueued with a delay now wakes the
-- reapers at commit on channel jobq_delayed: one sleeping past its due time
-- probes again and sleeps until then. One notification per transaction (the
-- payload is the same), none for jobs published at once (their producer
-- publishes them) or released by a parent (jobq_relay, as before).
-- CREATE OR REPLACE keeps both functions' owner and grants.

CREATE OR REPLACE FUNCTION jobq.enqueue(queue text, payload jsonb DEFAULT '{}'::jsonb, delay_s double precision DEFAULT 0, idempotency_key text DEFAULT NULL::text, relay_grace_s double precision DEFAULT 0, priority integer DEFAULT 0, key text DEFAULT NULL::text, debounce_s double precision DEFAULT 0, after uuid[] DEFAULT NULL::uuid[], workflow_id uuid DEFAULT NULL::uuid)
 RETURNS uuid
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
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
    parents uuid[] := ARRAY(SELECT DISTINCT p FROM unnest(enqueue.after) AS p WHERE p IS NOT NULL);
    found_n integer := 0;
    waiting integer := 0;
    dead_parent uuid;
    dead_status text;
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
    IF cardinality(parents) > 1000 THEN
        RAISE EXCEPTION 'jobq: a job may wait for at most 1000 jobs, got %', cardinality(parents)
            USING ERRCODE = '22023', HINT = 'fan in through intermediate jobs';
    END IF;
    IF cardinality(parents) > 0 AND debounce > 0 THEN
        RAISE EXCEPTION 'jobq: a debounced job cannot wait for other jobs'
            USING ERRCODE = '22023', HINT = 'drop debounce_s or after';
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
    IF cardinality(parents) > 0 THEN
        -- The jobs it waits for, locked (in id order, as every multi-row
        -- lock) so that none ends between this count and this commit: an
        -- end waits for the lock, then its trigger sees this job.
        SELECT count(*), count(*) FILTER (WHERE p.status IN ('queued', 'active')),
               (array_agg(p.id ORDER BY p.id) FILTER (WHERE p.status IN ('failed', 'cancelled')))[1],
               (array_agg(p.status ORDER BY p.id) FILTER (WHERE p.status IN ('failed', 'cancelled')))[1]
        INTO found_n, waiting, dead_parent, dead_status
        FROM (SELECT pp.id, pp.status FROM jobq.job pp WHERE pp.id = ANY(parents)
              ORDER BY pp.id FOR NO KEY UPDATE) p;
        IF found_n < cardinality(parents) THEN
            RAISE EXCEPTION 'jobq: % of the jobs this job waits for do not exist',
                cardinality(parents) - found_n USING ERRCODE = '23503',
                HINT = 'after => the ids jobq returned for jobs that are still kept';
        END IF;
    END IF;
    INSERT INTO jobq.job AS j (queue, payload, idempotency_key, run_at, relay_after, enqueued_by,
                               priority, key, waiting_on, workflow_id, status, finished_at,
                               last_error)
    VALUES (enqueue.queue, doc, enqueue.idempotency_key,
            now() + make_interval(secs => delay),
            -- A delayed job is published by the relay when due; otherwise the
            -- caller may promise to publish it itself within relay_grace_s. A
            -- job that waits for others is released by the last one's end.
            CASE WHEN waiting > 0 OR dead_parent IS NOT NULL THEN 'infinity'::timestamptz
                 ELSE now() + make_interval(secs => CASE WHEN delay > 0 THEN delay
                     ELSE least(greatest(coalesce(enqueue.relay_grace_s, 0), 0), 3600) END) END,
            CASE WHEN enqueue.idempotency_key IS NOT NULL THEN session_user::text END,
            enqueue.priority, enqueue.key,
            CASE WHEN dead_parent IS NULL THEN waiting ELSE 0 END, enqueue.workflow_id,
            CASE WHEN dead_parent IS NULL THEN 'queued' ELSE 'cancelled' END,
            CASE WHEN dead_parent IS NULL THEN NULL ELSE now() END,
            CASE WHEN dead_parent IS NULL THEN NULL
                 ELSE format('cancelled: job %s it waits for was %s', dead_parent, dead_status) END)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NOT NULL AND cardinality(parents) > 0 THEN
        INSERT INTO jobq.job_dependency (parent_id, job_id)
        SELECT p, new_id FROM unnest(parents) AS p;
        UPDATE jobq.job pp SET has_dependants = true
        WHERE pp.id = ANY(parents) AND NOT pp.has_dependants;
        IF waiting > 0 OR dead_parent IS NOT NULL THEN
            RETURN new_id;  -- nothing to publish now
        END IF;
    END IF;
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
    ELSIF delay > 0 THEN
        -- The relay's when due: wake a reaper sleeping longer than that.
        PERFORM pg_notify('jobq_delayed', '');
    END IF;
    RETURN new_id;
END;
$function$;

CREATE OR REPLACE FUNCTION jobq.enqueue_many(queues text[], payloads jsonb[], delays_s double precision[] DEFAULT NULL::double precision[], idempotency_keys text[] DEFAULT NULL::text[], relay_grace_s double precision DEFAULT 0, priorities integer[] DEFAULT NULL::integer[], keys text[] DEFAULT NULL::text[], debounces_s double precision[] DEFAULT NULL::double precision[])
 RETURNS TABLE(n bigint, id uuid)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
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
    IF EXISTS (SELECT 1 FROM unnest(enqueue_many.delays_s) AS u(delay) WHERE u.delay > 0) THEN
        -- The relay's when due: wake a reaper sleeping longer than that.
        PERFORM pg_notify('jobq_delayed', '');
    END IF;
END;
$function$;
