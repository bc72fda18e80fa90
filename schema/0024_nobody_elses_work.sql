-- Nobody else's work can stop yours (issue #47, DESIGN I11).
--
-- 1. A producer's open transaction no longer holds a lock a worker waits
--    on. jobq.enqueue(..., after => ...) used to lock each parent row FOR NO
--    KEY UPDATE and set its has_dependants until the producer committed: a
--    renewal or completion of that parent waited, and one worker's renewal
--    statement (all its leases) with it. Now the producer only reads its
--    parents and writes edges of its own (jobq.job_dependency, state 'new');
--    the reapers settle edges (jobq.settle_dependants): they arm an edge
--    whose parent still runs (has_dependants, the parent locked SKIP LOCKED
--    for a moment), and settle edges whose parent ended: release or cancel
--    the dependants, a bounded batch at a time, iteratively. A parent's end
--    only NOTIFYs (no cascade in the completion's transaction: a 1,000-long
--    chain made cancelling its head recurse past the stack, and 50,000
--    dependants held a worker's completions 1.5 s).
-- 2. Waiting for a result no longer writes the job row (jobq.job_watch).
-- 3. Debounce merges only into a job published with debounce by the same
--    login; idempotency keys are per login (a key another login used first
--    no longer refuses yours), and so is a workflow.
-- 4. Trace carriers are written only by the functions that insert their
--    jobs, and must be a set of string headers.
-- 5. A schedule belongs to the login that stored it.

-- Every table this migration changes, locked first and in one order: a
-- lock taken part-way (CREATE INDEX's SHARE, then ALTER TABLE's ACCESS
-- EXCLUSIVE on the same table) deadlocked with a running service's insert
-- in the rolling-upgrade test. Waiting here is bounded by migrate's
-- lock_timeout; it tries again.
LOCK TABLE jobq.queue, jobq.job, jobq.job_dependency, jobq.job_trace, jobq.schedule
    IN ACCESS EXCLUSIVE MODE;

-- ── 1. dependencies ──

ALTER TABLE jobq.job_dependency ADD COLUMN state text NOT NULL DEFAULT 'armed';
-- Edges that were settled under the old rules: the dependant no longer
-- waits, or the parent completed (its trigger released the dependant).
UPDATE jobq.job_dependency dep SET state = 'released'
FROM jobq.job d
WHERE d.id = dep.job_id AND NOT (d.status = 'queued' AND d.waiting_on > 0);
UPDATE jobq.job_dependency dep SET state = 'released'
FROM jobq.job p
WHERE p.id = dep.parent_id AND p.status = 'completed' AND dep.state = 'armed';
ALTER TABLE jobq.job_dependency
    ALTER COLUMN state SET DEFAULT 'new',
    ADD CONSTRAINT job_dependency_state_check CHECK (state IN ('new', 'armed', 'released'));

-- What the settler reads: new edges, and ended parents with armed edges.
CREATE INDEX job_dependency_new_idx ON jobq.job_dependency (parent_id, job_id)
    WHERE state = 'new';
CREATE INDEX job_ended_parent_idx ON jobq.job (finished_at)
    WHERE has_dependants AND status IN ('completed', 'failed', 'cancelled');

-- One settler at a time, fleet-wide: the row lock of a table nobody but
-- jobq's own functions may lock (an advisory lock is anyone's to take).
CREATE TABLE jobq.settler (one boolean PRIMARY KEY DEFAULT true CHECK (one));
INSERT INTO jobq.settler VALUES (true);

-- A parent's end only wakes the reapers; they settle its dependants.
CREATE OR REPLACE FUNCTION jobq.release_dependants() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    PERFORM pg_notify('jobq_relay', NEW.queue);  -- at commit
    RETURN NULL;
END $$;

-- Settle edges whose parent's end is known ($3: completed, failed,
-- cancelled, or gone: the parent row no longer exists). Each edge is settled
-- once (its state moves to 'released' in this statement, or it was already);
-- a dependant gets one decrement per completed parent, is released when none
-- is left, and is cancelled, with the reason, by the first dead one.
-- Dependants are locked in id order (every multi-row lock, schema 0017).
CREATE FUNCTION jobq.settle_edges(parents uuid[], jobs uuid[], ends text[])
RETURNS TABLE (released integer, cancelled integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    e_parent uuid[];
    e_job uuid[];
    e_end text[];
BEGIN
    WITH given AS (
        SELECT * FROM unnest(settle_edges.parents, settle_edges.jobs, settle_edges.ends)
                      AS g(parent_id, job_id, what)
    ), moved AS (
        UPDATE jobq.job_dependency d SET state = 'released'
        FROM given g
        WHERE d.parent_id = g.parent_id AND d.job_id = g.job_id AND d.state <> 'released'
        RETURNING d.parent_id, d.job_id, g.what
    )
    SELECT array_agg(m.parent_id), array_agg(m.job_id), array_agg(m.what)
    INTO e_parent, e_job, e_end FROM moved m;
    IF e_job IS NULL THEN
        RETURN QUERY SELECT 0, 0;
        RETURN;
    END IF;
    PERFORM 1 FROM jobq.job d WHERE d.id = ANY(e_job) ORDER BY d.id FOR NO KEY UPDATE;
    RETURN QUERY
    WITH per_job AS (
        SELECT e.job_id,
               count(*) FILTER (WHERE e.what = 'completed') AS done,
               (array_agg(e.parent_id ORDER BY e.parent_id)
                    FILTER (WHERE e.what <> 'completed'))[1] AS dead_parent,
               (array_agg(e.what ORDER BY e.parent_id)
                    FILTER (WHERE e.what <> 'completed'))[1] AS dead_end
        FROM unnest(e_parent, e_job, e_end) AS e(parent_id, job_id, what)
        GROUP BY e.job_id
    ), changed AS (
        UPDATE jobq.job d
        SET waiting_on = CASE WHEN p.dead_parent IS NULL
                              THEN greatest(d.waiting_on - p.done, 0)::integer ELSE 0 END,
            status = CASE WHEN p.dead_parent IS NULL THEN d.status ELSE 'cancelled' END,
            finished_at = CASE WHEN p.dead_parent IS NULL THEN d.finished_at ELSE now() END,
            last_error = CASE WHEN p.dead_parent IS NULL THEN d.last_error
                              WHEN p.dead_end = 'gone'
                              THEN format('cancelled: job %s it waits for no longer exists',
                                          p.dead_parent)
                              ELSE format('cancelled: job %s it waits for was %s',
                                          p.dead_parent, p.dead_end) END,
            -- released: published by the relay when due (its own delay kept)
            relay_after = CASE WHEN p.dead_parent IS NULL AND d.waiting_on - p.done <= 0
                               THEN greatest(now(), d.run_at) ELSE d.relay_after END,
            published_at = CASE WHEN p.dead_parent IS NULL AND d.waiting_on - p.done <= 0
                                THEN NULL ELSE d.published_at END
        FROM per_job p
        WHERE d.id = p.job_id AND d.status = 'queued' AND d.waiting_on > 0
        RETURNING d.id, d.status, d.waiting_on, d.last_error, d.queue
    ), logged AS (
        INSERT INTO jobq.job_event (job_id, event, detail)
        SELECT c.id, 'cancelled', c.last_error
        FROM changed c JOIN jobq.queue q ON q.name = c.queue
        WHERE c.status = 'cancelled' AND q.history
    )
    SELECT (count(*) FILTER (WHERE c.status = 'queued' AND c.waiting_on = 0))::integer,
           (count(*) FILTER (WHERE c.status = 'cancelled'))::integer
    FROM changed c;
END $$;

-- The reapers' duty (reaper/dependants.py): settle at most `budget` edges
-- and `rounds` rounds (a chain is settled a level a round), in one short
-- transaction of the caller's. `more`: budget or rounds ran out with work
-- left; the reaper comes straight back.
CREATE FUNCTION jobq.settle_dependants(budget integer, rounds integer DEFAULT 100)
RETURNS TABLE (released integer, cancelled integer, more boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    left_n integer := greatest(coalesce(settle_dependants.budget, 0), 1);
    rounds_left integer := greatest(coalesce(settle_dependants.rounds, 0), 1);
    n_released integer := 0;
    n_cancelled integer := 0;
    e_parent uuid[];
    e_job uuid[];
    e_end text[];
    took integer;
    r record;
    s record;
    batch uuid[];
BEGIN
    PERFORM 1 FROM jobq.settler FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN  -- another reaper is settling right now
        RETURN QUERY SELECT 0, 0, false;
        RETURN;
    END IF;
    LOOP
        took := 0;
        -- New edges: the parent's status now decides. Parents are locked
        -- without waiting (one being finished or renewed right now is looked
        -- at next round), so no end can slip between this look and the arming.
        WITH e AS (
            SELECT d.parent_id, d.job_id FROM jobq.job_dependency d
            WHERE d.state = 'new'
            ORDER BY d.parent_id, d.job_id
            LIMIT left_n
        ), p AS (
            SELECT j.id, j.status FROM jobq.job j
            WHERE j.id IN (SELECT e.parent_id FROM e)
            ORDER BY j.id
            FOR NO KEY UPDATE OF j SKIP LOCKED
        )
        SELECT array_agg(e.parent_id), array_agg(e.job_id),
               array_agg(CASE WHEN p.status IS NOT NULL THEN p.status
                              WHEN NOT EXISTS (SELECT 1 FROM jobq.job x WHERE x.id = e.parent_id)
                              THEN 'gone' END)
        INTO e_parent, e_job, e_end
        FROM e LEFT JOIN p ON p.id = e.parent_id;
        IF e_job IS NOT NULL THEN
            took := cardinality(array_remove(e_end, NULL));  -- armed or settled now
            WITH o AS (
                SELECT * FROM unnest(e_parent, e_job, e_end) AS o(parent_id, job_id, what)
            ), armed AS (
                UPDATE jobq.job_dependency d SET state = 'armed'
                FROM o
                WHERE o.what IN ('queued', 'active') AND d.parent_id = o.parent_id
                  AND d.job_id = o.job_id AND d.state = 'new'
                RETURNING d.parent_id
            )
            UPDATE jobq.job j SET has_dependants = true
            WHERE j.id IN (SELECT parent_id FROM armed) AND NOT j.has_dependants;
            SELECT array_agg(o.parent_id), array_agg(o.job_id), array_agg(o.what)
            INTO e_parent, e_job, e_end
            FROM unnest(e_parent, e_job, e_end) AS o(parent_id, job_id, what)
            WHERE o.what IN ('completed', 'failed', 'cancelled', 'gone');
            IF e_job IS NOT NULL THEN
                SELECT * INTO s FROM jobq.settle_edges(e_parent, e_job, e_end);
                n_released := n_released + s.released;
                n_cancelled := n_cancelled + s.cancelled;
            END IF;
        END IF;
        -- Ended parents with armed edges: a batch of their dependants each.
        FOR r IN
            SELECT j.id, j.status FROM jobq.job j
            WHERE j.has_dependants AND j.status IN ('completed', 'failed', 'cancelled')
            ORDER BY j.finished_at
            LIMIT 100
            FOR NO KEY UPDATE OF j SKIP LOCKED
        LOOP
            EXIT WHEN left_n - took <= 0;
            batch := ARRAY(SELECT d.job_id FROM jobq.job_dependency d
                           WHERE d.parent_id = r.id AND d.state = 'armed'
                           ORDER BY d.job_id LIMIT left_n - took);
            IF cardinality(batch) = 0 THEN
                UPDATE jobq.job SET has_dependants = false WHERE id = r.id;  -- all settled
                CONTINUE;
            END IF;
            SELECT * INTO s FROM jobq.settle_edges(array_fill(r.id, ARRAY[cardinality(batch)]),
                                                   batch,
                                                   array_fill(r.status, ARRAY[cardinality(batch)]));
            n_released := n_released + s.released;
            n_cancelled := n_cancelled + s.cancelled;
            took := took + cardinality(batch);
        END LOOP;
        left_n := left_n - took;
        rounds_left := rounds_left - 1;
        EXIT WHEN took = 0 OR left_n <= 0 OR rounds_left <= 0;
    END LOOP;
    RETURN QUERY SELECT n_released, n_cancelled, (took > 0 AND (left_n <= 0 OR rounds_left <= 0));
END $$;

REVOKE ALL ON FUNCTION jobq.settle_edges(uuid[], uuid[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION jobq.settle_dependants(integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.settle_dependants(integer, integer) TO jobq_reaper;
GRANT SELECT ON jobq.job_dependency TO jobq_reaper;  -- its probe looks for new edges

-- ── 2. waiting for a result: a row of the waiter's own ──

CREATE TABLE jobq.job_watch (
    job_id uuid PRIMARY KEY REFERENCES jobq.job (id) ON DELETE CASCADE,
    at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO jobq.job_watch (job_id) SELECT id FROM jobq.job WHERE watched
ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION jobq.notify_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM jobq.job_watch w WHERE w.job_id = NEW.id) THEN
        PERFORM pg_notify('jobq_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobq.notify_finished() FROM PUBLIC;

DROP TRIGGER job_finished_notify ON jobq.job;
CREATE TRIGGER job_finished_notify AFTER UPDATE OF status ON jobq.job
    FOR EACH ROW
    WHEN (new.status IN ('completed', 'failed', 'cancelled')
          AND old.status IS DISTINCT FROM new.status)
    EXECUTE FUNCTION jobq.notify_finished();

-- ── 3. who a job belongs to ──

-- Every insert path records its login (a SECURITY DEFINER function keeps
-- session_user: the caller's login).
ALTER TABLE jobq.job ALTER COLUMN enqueued_by SET DEFAULT session_user;
ALTER TABLE jobq.job ADD COLUMN debounced boolean NOT NULL DEFAULT false;

-- Idempotency keys are per login: another login's key neither refuses a
-- publish nor hands out its job. Slot keys of schedules are the reapers'
-- (enqueued_by 'jobq:schedule'), whichever reaper login fires the slot.
CREATE UNIQUE INDEX job_idempotency_login_idx ON jobq.job (queue, idempotency_key, enqueued_by)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX jobq.job_idempotency_key_idx;

DROP FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision, integer,
                           text, double precision, uuid[], uuid);
CREATE FUNCTION jobq.enqueue(
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
                               last_error, debounced)
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
            debounce > 0)
    ON CONFLICT (queue, idempotency_key, enqueued_by) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- this login used the key before: that job
        SELECT jj.id INTO new_id FROM jobq.job AS jj
        WHERE jj.queue = enqueue.queue AND jj.idempotency_key = enqueue.idempotency_key
          AND jj.enqueued_by = who;
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

REVOKE ALL ON FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision,
                                    integer, text, double precision, uuid[], uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision,
                                       integer, text, double precision, uuid[], uuid)
    TO jobq_producer, jobq_reaper;

-- ── 4. trace carriers ──

-- Only the enqueue statements (SECURITY DEFINER: queries.sql's
-- enqueue_many_traced and enqueue_linked) write them, for the jobs they
-- insert; a carrier is a set of string headers (a number made a consumer
-- with OpenTelemetry fail and release the job forever).
REVOKE INSERT ON jobq.job_trace FROM jobq_producer;
DELETE FROM jobq.job_trace
WHERE jsonb_path_exists(carrier, '$.* ? (@.type() != "string")');
ALTER TABLE jobq.job_trace ADD CONSTRAINT job_trace_headers
    CHECK (NOT jsonb_path_exists(carrier, '$.* ? (@.type() != "string")'));

-- ── 5. schedules ──

-- The login that stored an app's schedule; another app login cannot
-- overwrite it (a schedule enqueues jobs: nightly billing became every 5 s
-- with a forged payload). NULL: stored before this; the next app login to
-- store it takes it.
ALTER TABLE jobq.schedule ADD COLUMN owner text;

-- ── 6. retrying a job that waits for others ──

-- `jobq retry` of a failed or cancelled job. A job published `after`
-- others waits again for those that have not completed (it re-ran at once,
-- before its parent, when a failed parent had cancelled it); while one of
-- them failed, was cancelled or is gone it is not retried: `refused` says
-- which (retry that one first). One statement for `retry` and `retry
-- --queue` alike (queries.sql: retry_failed, retry_queue_batch).
CREATE FUNCTION jobq.retry_job(job uuid, why text)
RETURNS TABLE (id uuid, queue text, lock uuid, refused text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
    dead record;
    waits integer;
BEGIN
    PERFORM 1 FROM jobq.job j WHERE j.id = retry_job.job
        AND j.status IN ('failed', 'cancelled') FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT d.parent_id, coalesce(p.status, 'gone') AS status INTO dead
    FROM jobq.job_dependency d LEFT JOIN jobq.job p ON p.id = d.parent_id
    WHERE d.job_id = retry_job.job AND (p.id IS NULL OR p.status IN ('failed', 'cancelled'))
    ORDER BY d.parent_id LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT retry_job.job, NULL::text, NULL::uuid,
            format('it waits for job %s, which is %s: retry that one first', dead.parent_id,
                   CASE WHEN dead.status = 'gone' THEN 'no longer kept' ELSE dead.status END);
        RETURN;
    END IF;
    WITH rearmed AS (
        UPDATE jobq.job_dependency d SET state = 'new'
        FROM jobq.job p
        WHERE d.job_id = retry_job.job AND p.id = d.parent_id
          AND p.status IN ('queued', 'active')
        RETURNING d.parent_id
    )
    SELECT count(*) INTO waits FROM rearmed;
    IF waits > 0 THEN
        PERFORM pg_notify('jobq_relay', '');  -- the settler arms the edges again
    END IF;
    RETURN QUERY
    WITH again AS (
        UPDATE jobq.job j
        SET status = 'queued', errors = 0, stalls = 0, run_at = now(),
            relay_after = CASE WHEN waits > 0 THEN 'infinity'::timestamptz ELSE now() END,
            waiting_on = waits,
            published_at = NULL, finished_at = NULL, lease_expires_at = NULL,
            lock = gen_random_uuid()  -- a new spell (hand_back)
        FROM jobq.queue q
        WHERE j.id = retry_job.job AND q.name = j.queue
        RETURNING j.id, j.queue, j.lock, q.history
    ), logged AS (
        INSERT INTO jobq.job_event (job_id, event, detail)
        SELECT a.id, 'retried', coalesce(retry_job.why, 'by an operator')
               || CASE WHEN waits > 0 THEN format('; waits for %s job(s) again', waits)
                       ELSE '' END
        FROM again a WHERE a.history
    )
    SELECT a.id, a.queue, CASE WHEN waits > 0 THEN NULL ELSE a.lock END, NULL::text
    FROM again a;
END $$;
REVOKE ALL ON FUNCTION jobq.retry_job(uuid, text) FROM PUBLIC;

-- ── 7. per-key claim locks nobody else can take ──

-- A claim in a queue with per-key limits serialises the claims of each key
-- on a row of this table (queries.sql: claim), not on an advisory lock any
-- login could take and hold (one stalled a whole consumer for 58 s, another
-- queue's jobs included). Rows are made on first use and pruned by the
-- reapers with retention once their key has no job waiting or running.
CREATE TABLE jobq.key_lock (
    queue text NOT NULL,
    key text NOT NULL,
    PRIMARY KEY (queue, key)
);
GRANT SELECT, DELETE ON jobq.key_lock TO jobq_reaper;  -- no UPDATE: nobody may lock one

-- ── 8. what the reaper login may write ──

-- Only the columns its statements move (requeue, relay marks, unpark,
-- lost-message hand-back, a vanished worker's cut): it could rewrite any
-- job's payload (issue #47).
REVOKE UPDATE ON jobq.job FROM jobq_reaper;
GRANT UPDATE (status, lock, lease_expires_at, stalls, suspect_stalls, suspect, isolated,
              last_error, finished_at, run_at, relay_after, published_at)
    ON jobq.job TO jobq_reaper;

-- ── 9. parked jobs come back best first ──

-- The reapers release a limited queue's parked jobs by priority, then age
-- (queries.sql: unpark); without this index that order would sort every
-- parked job of the queue each sweep.
CREATE INDEX job_parked_best_idx ON jobq.job (queue, priority DESC, run_at, id)
    WHERE status = 'queued' AND relay_after = 'infinity' AND waiting_on = 0;

-- ── 10. a pause is recorded ──

ALTER TABLE jobq.queue ADD COLUMN paused_at timestamptz, ADD COLUMN paused_by text;

-- ── 11. a finished job frees one slot, once ──

-- unpark_freed (queries.sql) spends the proof a finished job gives its
-- consumer: one parked job released for it, not one per call.
ALTER TABLE jobq.job ADD COLUMN slot_freed boolean NOT NULL DEFAULT false;
