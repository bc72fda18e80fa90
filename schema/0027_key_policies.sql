-- Key policies (issue #51, DESIGN "Key policies and handler-side flow"):
-- what happens when a key already has work, per queue (jobq queue set Q
-- --key-policy). queue: fair across keys (as before, the default). fifo: per
-- key one at a time in publish order (job.seq); the claim refuses a job while
-- an earlier one of its key is queued or running (a retrying or crashed head
-- included) and parks it; the head's end releases the next. latest: a newer
-- job of the key supersedes the older ones: the claim cancels a pending one,
-- the running one's own renewal cancels it (so no producer ever locks a
-- worker's row, I11). singleton: a publish while the key has a live job
-- returns that job's id (job_singleton_idx: two racing publishers make one).
-- The policy is copied onto the job (key_policy) at publish: a change of the
-- queue's policy applies to jobs published after it.
ALTER TABLE jobq.queue ADD COLUMN key_policy text NOT NULL DEFAULT 'queue'
    CONSTRAINT queue_key_policy_check CHECK (key_policy IN ('queue', 'fifo', 'latest', 'singleton'));
ALTER TABLE jobq.job ADD COLUMN key_policy text
    CONSTRAINT job_key_policy_check CHECK (key_policy IN ('fifo', 'latest', 'singleton'));
CREATE SEQUENCE jobq.job_seq;
ALTER TABLE jobq.job ADD COLUMN seq bigint;  -- publish order of a fifo or latest job
COMMENT ON COLUMN jobq.job.seq IS 'Publish order of a keyed job of a fifo or latest queue.';
CREATE UNIQUE INDEX job_singleton_idx ON jobq.job (queue, key)
    WHERE key_policy = 'singleton' AND status IN ('queued', 'active');
CREATE INDEX job_key_seq_idx ON jobq.job (queue, key, seq) WHERE seq IS NOT NULL;

CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text, payload jsonb DEFAULT '{}'::jsonb, delay_s double precision DEFAULT 0,
    idempotency_key text DEFAULT NULL, relay_grace_s double precision DEFAULT 0,
    priority integer DEFAULT 0, key text DEFAULT NULL, debounce_s double precision DEFAULT 0,
    after uuid[] DEFAULT NULL, workflow_id uuid DEFAULT NULL)
RETURNS uuid
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
    INSERT INTO jobq.job AS j (queue, payload, idempotency_key, run_at, relay_after, enqueued_by,
                               priority, key, waiting_on, workflow_id, status, finished_at,
                               last_error, debounced, key_policy, seq)
    VALUES (enqueue.queue, doc, enqueue.idempotency_key,
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
            CASE WHEN policy IN ('fifo', 'latest') THEN nextval('jobq.job_seq') END)
    -- No target: the idempotency key's index, or job_singleton_idx (another
    -- publisher's live job of the key; this waits for its commit).
    ON CONFLICT DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- this login used the key before: that job
        SELECT jj.id INTO new_id FROM jobq.job AS jj
        WHERE jj.queue = enqueue.queue AND jj.idempotency_key = enqueue.idempotency_key
          AND jj.enqueued_by = who;
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
$$;


-- A batch takes the one-statement path only for jobs no key policy applies
-- to: a keyed job of a fifo, latest or singleton queue goes through
-- jobq.enqueue, which knows the policy.
CREATE OR REPLACE FUNCTION jobq.enqueue_many(
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
                    AND (u.jkey IS NULL OR q.key_policy = 'queue')
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

