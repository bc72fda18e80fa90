-- The security review of efa7239 (issue #28): what a producer or consumer
-- login can reach beyond its own jobs, and one schedule that stopped every
-- sweep duty.

-- ── Schedules are the operator's ──
-- source: who set it. 'operator' (jobq schedule set, SQL) wins; consumers
-- store their app's declarations ('app') through q_schedule_declare, which
-- never touches an operator's row. Rows from before this migration are the
-- operator's: an app re-declaring one is refused with a log line saying how
-- to hand it back (jobq schedule delete).
-- last_error: why the last slot could not be fired (the reaper steps over
-- it; schedules.py), NULL once a slot fires or the schedule is set again.
ALTER TABLE jobq.schedule
    ADD COLUMN source text NOT NULL DEFAULT 'operator' CHECK (source IN ('operator', 'app')),
    ADD COLUMN last_error text,
    ADD COLUMN last_error_at timestamptz;

-- Five cron fields, as documented (cronsim would also take a sixth). Not
-- VALID for rows already stored: the reaper records and disables those.
ALTER TABLE jobq.schedule
    ADD CONSTRAINT schedule_cron_five_fields
    CHECK (cron ~ '^\s*\S+(\s+\S+){4}\s*$') NOT VALID;

-- A schedule whose payload its queue would refuse is refused where it is
-- written, not at every slot. (A queue's limit lowered later is caught when
-- the slot fires: recorded on the schedule, stepped over.)
CREATE FUNCTION jobq.schedule_payload_fits() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    lim integer;
BEGIN
    SELECT q.max_payload_bytes INTO lim FROM jobq.queue q WHERE q.name = NEW.queue;
    IF lim IS NOT NULL AND octet_length(NEW.payload::text) > lim THEN
        RAISE EXCEPTION 'jobq: schedule %: payload is % bytes, over the % byte limit of queue %',
            NEW.name, octet_length(NEW.payload::text), lim, NEW.queue
            USING ERRCODE = '22001',
                  HINT = 'use a smaller payload, or raise the queue''s max_payload_bytes';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER schedule_payload_fits
    BEFORE INSERT OR UPDATE OF payload, queue ON jobq.schedule
    FOR EACH ROW EXECUTE FUNCTION jobq.schedule_payload_fits();
REVOKE ALL ON FUNCTION jobq.schedule_payload_fits() FROM PUBLIC;

-- ── Idempotency keys do not leak across producer logins ──
-- enqueued_by: the login that enqueued a keyed job (NULL for keyless jobs,
-- so the common path writes nothing more). A key another login already used
-- is refused without the job's id; keys starting with 'schedule:' name a
-- periodic job's slot and only the reapers (and the owner) may use them, so
-- no producer can pre-claim a slot and make the scheduled run vanish.
ALTER TABLE jobq.job ADD COLUMN enqueued_by text;

-- jobq.enqueue as in 0011, with those two checks; CREATE OR REPLACE resets
-- the attributes, so they are written out again.
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
    INSERT INTO jobq.job AS j (queue, payload, idempotency_key, run_at, relay_after, enqueued_by)
    VALUES (enqueue.queue, doc, enqueue.idempotency_key,
            now() + make_interval(secs => delay),
            -- A delayed job is published by the relay when due; otherwise the
            -- caller may promise to publish it itself within relay_grace_s.
            now() + make_interval(secs => CASE WHEN delay > 0 THEN delay
                                               ELSE least(greatest(coalesce(enqueue.relay_grace_s, 0), 0), 3600) END),
            CASE WHEN enqueue.idempotency_key IS NOT NULL THEN session_user::text END)
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

-- ── A consumer fails only a job whose claim fails on its own data ──
-- The consumer used to say which job to fail and why (q_quarantine): any
-- queued job of any queue. Now the database tries the claim itself, in a
-- subtransaction, and fails the job only if that claim raises a data error
-- (SQLSTATE class 22), with the server's message. A claim that works is
-- rolled back (SQLSTATE JQ001 undoes it) and false comes back: nothing
-- changed, the consumer requeues the message.
CREATE FUNCTION jobq.claim_or_fail(p_job uuid, p_worker text, p_queues text[], p_token uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    why text;
    failed boolean;
BEGIN
    BEGIN
        PERFORM 1 FROM jobq.q_claim(ARRAY[p_job], p_worker, p_queues, ARRAY[p_token]);
        RAISE EXCEPTION 'jobq: claimable' USING ERRCODE = 'JQ001';
    EXCEPTION
        WHEN SQLSTATE 'JQ001' THEN
            RETURN false;
        WHEN data_exception THEN
            why := SQLERRM;
    END;
    WITH bad AS (
        UPDATE jobq.job j
        SET status = 'failed', finished_at = now(), lease_expires_at = NULL,
            last_error = format('cannot be claimed: %s (check the queue''s settings; then '
                                'jobq retry)', why)
        WHERE j.id = p_job AND j.status = 'queued' AND j.queue = ANY(p_queues)
        RETURNING j.id, j.last_error
    ), logged AS (
        INSERT INTO jobq.job_event (job_id, event, detail)
        SELECT id, 'failed', last_error FROM bad
    )
    SELECT count(*) > 0 INTO failed FROM bad;
    RETURN failed;
END $$;
REVOKE ALL ON FUNCTION jobq.claim_or_fail(uuid, text, text[], uuid) FROM PUBLIC;
