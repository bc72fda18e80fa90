-- A reused idempotency key with another payload is said, not silent (issue
-- #50.10). A publish whose key is held returns the holder's id, as before
-- (Oban, River and BullMQ return the existing job too; on_duplicate =>
-- 'refuse' refuses); when the payload it brought differs from the holder's,
-- it now raises a WARNING naming the job, which psql prints and the Python
-- client logs (logger jobq.client), so a key reused by mistake is seen the first
-- time. Only a duplicate pays for the check: one read of the holder by id.
-- jobq.enqueue is restated from 0032 with the two duplicate paths calling it
-- (plpgsql names its parameters by the function's name: it cannot be
-- renamed and wrapped).
CREATE FUNCTION jobq.idempotency_payload_check(k text, holder uuid, doc jsonb) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_custom_plan'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM jobq.job j WHERE j.id = holder AND j.payload IS DISTINCT FROM doc) THEN
        RAISE WARNING 'jobq: idempotency key % already names job % with another payload: that '
                      'job is returned and this payload is not stored', quote_literal(k), holder
            USING HINT = 'a new job needs a new key; on_duplicate => ''refuse'' makes a held key an error';
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION jobq.idempotency_payload_check(text, uuid, jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION jobq.enqueue(queue text, payload jsonb DEFAULT '{}'::jsonb, delay_s double precision DEFAULT 0, idempotency_key text DEFAULT NULL::text, relay_grace_s double precision DEFAULT 0, priority integer DEFAULT 0, key text DEFAULT NULL::text, debounce_s double precision DEFAULT 0, after uuid[] DEFAULT NULL::uuid[], workflow_id uuid DEFAULT NULL::uuid, expires_in_s double precision DEFAULT NULL::double precision, idempotency_window_s double precision DEFAULT NULL::double precision, idempotency_while_live boolean DEFAULT false, on_duplicate text DEFAULT 'return'::text) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_custom_plan'
    AS $_$
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
    who text := CASE WHEN enqueue.idempotency_key LIKE 'schedule:%' THEN 'jobq:schedule'
                     ELSE session_user::text END;
    new_id uuid;
    parents uuid[] := ARRAY(SELECT DISTINCT p FROM unnest(enqueue.after) AS p WHERE p IS NOT NULL);
    p_id uuid[];
    p_status text[];
    waiting integer := 0;
    dead_parent uuid;
    dead_status text;
    policy text;  -- the queue's key policy for this keyed job (NULL: none, 'queue')
    scope text := CASE WHEN enqueue.idempotency_while_live THEN 'live'
                       WHEN enqueue.idempotency_window_s IS NOT NULL THEN 'window' END;
    take_id uuid;  -- a windowed key's new job id, drawn before its hold is taken
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
    IF enqueue.expires_in_s IS NOT NULL AND NOT (enqueue.expires_in_s > 0
                                                 AND enqueue.expires_in_s < 31536000) THEN
        RAISE EXCEPTION 'jobq: expires_in_s must be a positive number of seconds under a year, got %',
            enqueue.expires_in_s USING ERRCODE = '22023',
            HINT = 'the time from now within which the job must start, in seconds';
    END IF;
    IF enqueue.expires_in_s IS NOT NULL AND enqueue.expires_in_s <= delay THEN
        RAISE EXCEPTION 'jobq: expires_in_s (%) is not after delay_s (%): the job could never start',
            enqueue.expires_in_s, delay USING ERRCODE = '22023',
            HINT = 'expires_in_s counts from now, as delay_s does';
    END IF;
    IF enqueue.expires_in_s IS NOT NULL AND debounce > 0 THEN
        RAISE EXCEPTION 'jobq: a debounced job takes no expires_in_s'
            USING ERRCODE = '22023', HINT = 'drop debounce_s or expires_in_s';
    END IF;
    IF enqueue.on_duplicate IS NULL OR enqueue.on_duplicate NOT IN ('return', 'refuse') THEN
        RAISE EXCEPTION 'jobq: on_duplicate must be return or refuse, got %',
            quote_nullable(enqueue.on_duplicate) USING ERRCODE = '22023',
            HINT = 'return: the holder''s id (the default); refuse: an error naming it';
    END IF;
    IF enqueue.idempotency_window_s IS NOT NULL AND NOT (enqueue.idempotency_window_s > 0
                                                         AND enqueue.idempotency_window_s < 31536000) THEN
        RAISE EXCEPTION 'jobq: idempotency_window_s must be a positive number of seconds under a year, got %',
            enqueue.idempotency_window_s USING ERRCODE = '22023',
            HINT = 'how long after its publish the key stays held';
    END IF;
    IF scope IS NOT NULL AND enqueue.idempotency_key IS NULL THEN
        RAISE EXCEPTION 'jobq: idempotency_window_s and idempotency_while_live need an idempotency_key'
            USING ERRCODE = '22023', HINT = 'pass idempotency_key => ''...''';
    END IF;
    IF enqueue.idempotency_while_live AND enqueue.idempotency_window_s IS NOT NULL THEN
        RAISE EXCEPTION 'jobq: pass idempotency_window_s or idempotency_while_live, not both'
            USING ERRCODE = '22023', HINT = 'while live: until its job ends; a window: N seconds';
    END IF;
    IF scope IS NOT NULL AND slot_key THEN
        RAISE EXCEPTION 'jobq: a schedule''s slot key takes no window'
            USING ERRCODE = '22023', HINT = 'leave idempotency_window_s and idempotency_while_live out';
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
    IF enqueue.workflow_id IS NOT NULL AND EXISTS (
           SELECT 1 FROM jobq.job w
           WHERE w.workflow_id = enqueue.workflow_id AND w.enqueued_by IS DISTINCT FROM who) THEN
        RAISE EXCEPTION 'jobq: workflow % belongs to another login', enqueue.workflow_id
            USING ERRCODE = '42501', HINT = 'publish the steps of a workflow from one login';
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
    policy := CASE WHEN enqueue.key IS NOT NULL AND q.key_policy <> 'queue'
                   THEN q.key_policy END;
    IF policy IS NOT NULL AND (debounce > 0 OR cardinality(parents) > 0) THEN
        RAISE EXCEPTION 'jobq: queue % has key policy %: its keyed jobs take no debounce_s or after',
            quote_literal(enqueue.queue), policy USING ERRCODE = '22023',
            HINT = 'publish without them, or to a queue whose key policy is queue';
    END IF;
    IF policy = 'singleton' THEN
        -- The key's live job, if any, read without a lock (I11): its end
        -- never waits for this transaction. Two publishers racing meet at
        -- job_singleton_idx below.
        SELECT jj.id INTO new_id FROM jobq.job AS jj
        WHERE jj.queue = enqueue.queue AND jj.key = enqueue.key
          AND jj.key_policy = 'singleton' AND jj.status IN ('queued', 'active');
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
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
        -- One login's publishes of one key, one at a time: an advisory lock
        -- in a space of its own (no claim, and no other login's publish,
        -- waits on it). Only a job this login published with debounce and
        -- not yet due is merged into.
        PERFORM pg_advisory_xact_lock(hashtext('jobq.debounce:' || who || ':' || enqueue.queue),
                                      hashtext(enqueue.key));
        UPDATE jobq.job AS j
        SET payload = doc, run_at = now() + make_interval(secs => debounce),
            relay_after = now() + make_interval(secs => debounce), priority = enqueue.priority
        WHERE j.id = (SELECT jj.id FROM jobq.job AS jj
                      WHERE jj.queue = enqueue.queue AND jj.key = enqueue.key
                        AND jj.debounced AND jj.enqueued_by = who
                        AND jj.status = 'queued' AND jj.run_at > now()
                        AND jj.published_at IS NULL AND jj.relay_after < 'infinity'
                      ORDER BY jj.run_at DESC LIMIT 1
                      FOR NO KEY UPDATE)
        RETURNING j.id INTO new_id;
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
        delay := greatest(delay, debounce);
    END IF;
    IF cardinality(parents) > 0 THEN
        -- The jobs it waits for, read once, without a lock: their ends must
        -- never wait for this transaction (I11). A parent that ends before
        -- this commits is seen by the reapers' settler, which looks at every
        -- new edge after its commit (jobq.settle_dependants).
        SELECT array_agg(pp.id ORDER BY pp.id), array_agg(pp.status ORDER BY pp.id)
        INTO p_id, p_status
        FROM jobq.job pp WHERE pp.id = ANY(parents);
        IF coalesce(cardinality(p_id), 0) < cardinality(parents) THEN
            RAISE EXCEPTION 'jobq: % of the jobs this job waits for do not exist',
                cardinality(parents) - coalesce(cardinality(p_id), 0) USING ERRCODE = '23503',
                HINT = 'after => the ids jobq returned for jobs that are still kept';
        END IF;
        SELECT count(*) FILTER (WHERE s IN ('queued', 'active')),
               (array_agg(i ORDER BY i) FILTER (WHERE s IN ('failed', 'cancelled')))[1],
               (array_agg(s ORDER BY i) FILTER (WHERE s IN ('failed', 'cancelled')))[1]
        INTO waiting, dead_parent, dead_status
        FROM unnest(p_id, p_status) AS u(i, s);
    END IF;
    IF scope IS NOT NULL THEN
        -- A windowed key (schema 0032): its hold is a row of jobq.job_unique,
        -- never a lock on the holder's job row (I11).
        take_id := gen_random_uuid();
        new_id := jobq.idempotency_take(enqueue.queue, who, enqueue.idempotency_key, take_id,
                                        enqueue.idempotency_window_s, scope = 'live');
        IF new_id IS NOT NULL THEN
            IF enqueue.on_duplicate = 'refuse' THEN
                RAISE EXCEPTION 'jobq: duplicate: idempotency key % is held by job %',
                    quote_literal(enqueue.idempotency_key), new_id USING ERRCODE = '23505',
                    HINT = 'the job that holds the key is the one to wait for';
            END IF;
            PERFORM jobq.idempotency_payload_check(enqueue.idempotency_key, new_id, doc);
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO jobq.job AS j (id, queue, payload, idempotency_key, run_at, relay_after, enqueued_by,
                               priority, key, waiting_on, workflow_id, status, finished_at,
                               last_error, debounced, key_policy, seq, expires_at,
                               idempotency_scope)
    VALUES (coalesce(take_id, gen_random_uuid()), enqueue.queue, doc, enqueue.idempotency_key,
            now() + make_interval(secs => delay),
            -- A delayed job is published by the relay when due; otherwise the
            -- caller may promise to publish it itself within relay_grace_s. A
            -- job that waits for others is released by the reapers' settler.
            CASE WHEN waiting > 0 OR dead_parent IS NOT NULL THEN 'infinity'::timestamptz
                 ELSE now() + make_interval(secs => CASE WHEN delay > 0 THEN delay
                     ELSE least(greatest(coalesce(enqueue.relay_grace_s, 0), 0), 3600) END) END,
            who, enqueue.priority, enqueue.key,
            CASE WHEN dead_parent IS NULL THEN waiting ELSE 0 END, enqueue.workflow_id,
            CASE WHEN dead_parent IS NULL THEN 'queued' ELSE 'cancelled' END,
            CASE WHEN dead_parent IS NULL THEN NULL ELSE now() END,
            CASE WHEN dead_parent IS NULL THEN NULL
                 ELSE format('cancelled: job %s it waits for was %s', dead_parent, dead_status) END,
            debounce > 0, policy,
            CASE WHEN policy IN ('fifo', 'latest') THEN nextval('jobq.job_seq') END,
            now() + make_interval(secs => enqueue.expires_in_s), scope)
    -- No target: the idempotency key's index, or job_singleton_idx (another
    -- publisher's live job of the key; this waits for its commit).
    ON CONFLICT DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- this login used the key before: that job
        SELECT jj.id INTO new_id FROM jobq.job AS jj
        WHERE jj.queue = enqueue.queue AND jj.idempotency_key = enqueue.idempotency_key
          AND jj.enqueued_by = who AND jj.idempotency_scope IS NULL;
        IF new_id IS NOT NULL AND enqueue.on_duplicate = 'refuse' THEN
            RAISE EXCEPTION 'jobq: duplicate: idempotency key % is held by job %',
                quote_literal(enqueue.idempotency_key), new_id USING ERRCODE = '23505',
                HINT = 'the job that holds the key is the one to wait for';
        END IF;
        IF new_id IS NOT NULL AND NOT slot_key THEN
            PERFORM jobq.idempotency_payload_check(enqueue.idempotency_key, new_id, doc);
        END IF;
        IF new_id IS NULL AND policy = 'singleton' THEN  -- the key's live job
            SELECT jj.id INTO new_id FROM jobq.job AS jj
            WHERE jj.queue = enqueue.queue AND jj.key = enqueue.key
              AND jj.key_policy = 'singleton' AND jj.status IN ('queued', 'active');
        END IF;
        IF new_id IS NULL THEN
            RAISE EXCEPTION 'jobq: the job of key % in queue % ended while this publish '
                            'waited for it', quote_literal(enqueue.key), quote_literal(enqueue.queue)
                USING ERRCODE = '40001', HINT = 'publish again: a new job is made';
        END IF;
        RETURN new_id;
    END IF;
    IF cardinality(parents) > 0 THEN
        -- Edges of the statuses read above: a completed parent's is settled
        -- already, every other one is the settler's (a dead parent's too, so
        -- that nothing settles this cancelled job again).
        INSERT INTO jobq.job_dependency (parent_id, job_id, state)
        SELECT u.i, new_id,
               CASE WHEN dead_parent IS NULL AND u.s IN ('queued', 'active') THEN 'new'
                    ELSE 'released' END
        FROM unnest(p_id, p_status) AS u(i, s);
        IF waiting > 0 THEN
            PERFORM pg_notify('jobq_relay', enqueue.queue);  -- the settler arms the edges
        END IF;
        IF waiting > 0 OR dead_parent IS NOT NULL THEN
            RETURN new_id;  -- nothing to publish now
        END IF;
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
$_$;
