-- Every statement jobq runs, as named blocks ("-- name: x"), loaded by sql.py.
-- A test prepares each one against the migrated schema.
--
-- Lease rules, readable here as a whole:
--   * claim sets a fresh lock token (a random UUID the consumer drew for
--     that delivery, so a claim retried after a lost reply knows its rows)
--     and a deadline from the database clock (now() + the queue's lease_s);
--     every other new token (a spell put back in line, parked, handed on,
--     unparked) is drawn by the database (gen_random_uuid());
--   * every later write by a worker (renew, complete, fail, release) is fenced
--     by  id AND lock = token AND status = 'active' AND lease_expires_at > now();
--     zero rows means the lease is lost: the caller stops, it never retries;
--   * only the reaper moves an active row whose deadline passed, and it takes
--     each one under FOR UPDATE SKIP LOCKED, so one reaper requeues it once.
--   * the lock column keeps the token of the latest claim after the lease
--     ends: a retried completion recognises itself, and a publisher's
--     "published" mark only hits the queued spell it published.
--   * every transition the row does not keep for good appends to
--     jobq.job_event in the same statement (a data-modifying CTE), when the
--     queue's history is on: all but enqueue and completion, which
--     jobq.history reads from the row (schema 0011).
--
-- Rights: a block with a "-- grant:" line is installed by `jobq migrate` as
-- the SECURITY DEFINER function jobq.q_<name> (routines.py) and executable
-- only by the roles it names: those roles need no right on the tables, so a
-- consumer can change only the rows whose lock token it holds.
--
-- Plans: a statement that names its rows by id finds them through the primary
-- key, always. Its status test is written `status COLLATE "C" = '...'`: the
-- same equality (status values are ASCII), but the planner can no longer match
-- it to the partial indexes' `status = '...'` predicates. Without it, stale
-- statistics (analyzed while the table was empty, or while everything was
-- queued) made claims walk job_queued_idx (15,658 rows read for 10 claims) and
-- completions walk job_active_idx's dead entries: drain fell from ~3,000 to
-- ~1,700 jobs/s. And each row it writes is named by `j.id = ANY(<the ids>)`
-- in the statement that writes it (an array of ids, or ARRAY(SELECT ...) of a
-- CTE's): an index condition the plan cannot drop. A join to unnest() alone
-- left the planner free to walk the whole primary key and filter (issue #49:
-- a completion read 3,674 buffers at 8,000 jobs, growing with the table).
-- tests/integration/test_plans.py holds every such statement to both.
--
-- Contents (written by docs/generate.py; tests/unit/test_docs.py keeps it true):
--   publish: enqueue_many, enqueue_many_traced, trace_of, enqueue_linked, held_back,
--       queue_limits, mark_published, mark_republished, relay_take, relay_defer, relay_mark
--   claim and run: claim, claim_plain, claim_recover, claim_misses, renew
--   run and finish: complete, finished_by, progress, output_emit, parents, step_get,
--       step_names, step_record, signal, output_read, watch, fail, snooze, suspend, spawn,
--       join_results, signal_get, release
--   reap: requeue_lapsed, isolate, child_died, quarantine, lost_candidates,
--       local_statement_timeout, backlog, lost_horizon, unpublish_lost, unpark, unpark_freed,
--       wake_signalled, settle_dependants, schedules_due, schedule_lock, schedule_try_lock,
--       schedule_fire, schedule_trigger, schedule_backfill, schedule_get, schedule_overlap,
--       schedule_set, schedule_upsert, schedule_skip, db_now, schedule_list, schedule_delete,
--       expire_due, supersede_pending, sweep_probe, audit_claims, audit_completions, audit_now,
--       audit_list, audit_runs
--   workers: worker_busy, worker_lock, client_check_interval, worker_register, worker_gone,
--       worker_pool, worker_handlers, workers_vanished, workers_prune, lease_lost_event
--   operator verbs: cancel, retry_failed, cancel_queue_batch, retry_queue_batch,
--       queue_job_counts, queue_delete, prune_batch, prune_count, prune_expired,
--       key_rate_prune, history
--   reapers: reaper_register, reaper_swept, reaper_failed, reaper_gone
--   queues: queue_ensure, queue_list, queue_update, queue_pause, queue_resume, key_stats,
--       key_limit_set, queue_limits_get, queue_limits_set
--   inspect: stats, job_status, job_get, job_links, job_steps, workflow_jobs, workflow_cancel
--   dashboard: dash_queues, dash_jobs, job_prefix, workflow_prefix, dash_throughput,
--       dash_running, dash_stalled, dash_failed, dash_job, dash_output, dash_workers,
--       reader_member, dash_reapers
--   install: database_exists, create_database_statement, role_exists, role_create_statement,
--       current_login, session_login, owner_joined, owner_join, schema_owner, as_owner,
--       roles_shared_with, schema_present, database_name, schema_namespace, schema_create,
--       migrations_present, migrations_create, migrations_applied, migration_record,
--       lock_timeout_local, migrate_lock, migrate_unlock, type_names, routines_present,
--       routines_create, routines_installed, routine_record, routine_forget,
--       routine_drop_statement, routine_grant_statements, ping, rollback
--   uninstall: uninstall_database_name, uninstall_schema_exists, uninstall_job_count,
--       uninstall_roles_present, uninstall_schema, uninstall_roles
-- (end of contents)

-- ───────────────────────────── publish ─────────────────────────────

-- name: enqueue_many
-- One round trip for any number of jobs; ids come back in input order.
-- jobq.enqueue_many (schema 0009, 0013) inserts a batch of plain rows in
-- one statement, and anything else row by row through jobq.enqueue. The
-- arrays are named in the order of newjob.COLUMNS (a unit test holds them
-- to it), then the relay grace.
SELECT id FROM jobq.enqueue_many(queues => $1::text[], payloads => $2::jsonb[],
                                 delays_s => $3::float8[], idempotency_keys => $4::text[],
                                 priorities => $5::int[], keys => $6::text[],
                                 debounces_s => $7::float8[], relay_grace_s => $8::float8)
ORDER BY n;

-- name: enqueue_many_traced
-- grant: jobq_producer
-- enqueue_many, and the publisher's trace context of each row that has one
-- stored beside it in the same statement (tracing.py; $9: JSON or NULL).
-- The job's row is inserted by the function before this statement's foreign
-- key checks run at its end. A function (the grant line): producers have no
-- right on jobq.job_trace, so a carrier is only ever written for the jobs
-- this very call returns (schema 0024).
WITH made AS (
    SELECT id, n FROM jobq.enqueue_many(queues => $1::text[], payloads => $2::jsonb[],
                                        delays_s => $3::float8[], idempotency_keys => $4::text[],
                                        priorities => $5::int[], keys => $6::text[],
                                        debounces_s => $7::float8[], relay_grace_s => $8::float8)
), stored AS (
    INSERT INTO jobq.job_trace (job_id, carrier)
    SELECT made.id, t.carrier::jsonb
    FROM made JOIN unnest($9::text[]) WITH ORDINALITY AS t(carrier, n) ON t.n = made.n
    WHERE t.carrier IS NOT NULL
    ON CONFLICT (job_id) DO NOTHING
)
SELECT id FROM made ORDER BY n;

-- name: trace_of
-- A job's stored trace context (the consumer, before its handler runs).
SELECT carrier::text FROM jobq.job_trace WHERE job_id = $1;

-- name: enqueue_linked
-- grant: jobq_producer
-- One job that waits for others or belongs to a workflow (issue #31):
-- jobq.enqueue with every option; workflow.py runs a batch of these in one
-- transaction, parents before the jobs that wait for them. The publisher's
-- trace context ($11: JSON or NULL) is stored beside it, as enqueue_many_traced does.
-- A job with a deadline ($12: expires_in_s, schema 0031) comes this way too,
-- and one with a windowed key or on_duplicate 'refuse' ($13-$15, schema 0032).
WITH made AS (  -- the options named in the order of newjob.COLUMNS, one value each
    SELECT jobq.enqueue(queue => $1::text, payload => $2::jsonb, delay_s => $3::float8,
                        idempotency_key => $4::text, priority => $5::int, key => $6::text,
                        debounce_s => $7::float8, relay_grace_s => $8::float8,
                        after => $9::uuid[], workflow_id => $10::uuid,
                        expires_in_s => $12::float8, idempotency_window_s => $13::float8,
                        idempotency_while_live => $14::boolean,
                        on_duplicate => $15::text) AS id
), stored AS (
    INSERT INTO jobq.job_trace (job_id, carrier)
    SELECT made.id, $11::jsonb FROM made WHERE $11::text IS NOT NULL
    ON CONFLICT (job_id) DO NOTHING
)
SELECT id FROM made;

-- name: held_back
-- grant: jobq_producer
-- After a publish with keys: which of these new jobs a per-key cap parked
-- as they were inserted (schema 0015); the producer sends no message for
-- them (their key's freed slots release them).
SELECT id FROM jobq.job
WHERE id = ANY($1::uuid[]) AND status = 'queued' AND relay_after = 'infinity'
  AND waiting_on = 0 AND enqueued_by = session_user::text;  -- its own jobs only

-- name: queue_limits
-- The producer checks payload sizes before sending them (cached per queue).
SELECT name, max_payload_bytes FROM jobq.queue WHERE name = ANY($1::text[]);

-- name: mark_published
-- grant: jobq_producer
-- plan: generic
-- After the broker confirmed the ids (the producer defers it, one statement
-- for many publishes). Only the queued spell that was published is marked:
-- same lock token as read, NULL for a new row. A claim sets a new token, and
-- so does every statement that hands a queued row back to the relay (the
-- claim's park, unpublish_lost, retry_failed), so a late mark never
-- marks a spell whose message is not out. A row claimed meanwhile needs no
-- mark and costs no write. SKIP LOCKED: a row someone holds is being claimed
-- (then it needs no mark) or relayed (the relay marks it); never waiting here means never
-- deadlocking with batched claims. No history row: published_at says it
-- (the relay's publishes, the unusual ones, do write one). Each id's token
-- is read from $2 by the id's position: joined as unnest(), a deferred
-- mark of some hundred ids rescanned them once per row (#49).
WITH target AS (
    SELECT j.id
    FROM jobq.job j
    CROSS JOIN LATERAL (SELECT ($2::uuid[])[array_position($1::uuid[], j.id)] AS lock) t
    WHERE j.id = ANY($1::uuid[])
      AND j.lock IS NOT DISTINCT FROM t.lock
      AND j.status COLLATE "C" = 'queued'
      AND j.published_at IS NULL
      AND j.waiting_on = 0  -- a waiting job's publish is its release's
      -- a new row (no token yet) only if this login inserted it: a mark of
      -- another login's row would hide it from the relay until the
      -- lost-message check (schema 0024: enqueued_by); a spell's token,
      -- which only its maker holds, is proof enough
      AND (t.lock IS NOT NULL OR j.enqueued_by = session_user::text)
      -- Not a job that is not due: consumers drop its early delivery (a
      -- repeated idempotency key sends a delayed job's id), and only an
      -- unmarked row is published by the relay when it comes due.
      AND j.run_at <= now()
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobq.job j
SET published_at = now()
WHERE j.id = ANY(ARRAY(SELECT target.id FROM target));  -- once, not a join

-- name: mark_republished
-- grant: jobq_consumer
-- plan: generic
-- mark_published for a consumer's own republishes (release, a child's
-- death, unpark): only spells whose token the consumer made, so never a new
-- row's (NULL) spell: a consumer cannot mark another producer's fresh row
-- published and hide it until the lost-message check.
WITH target AS (
    SELECT j.id
    FROM jobq.job j
    WHERE j.id = ANY($1::uuid[])
      AND j.lock = ($2::uuid[])[array_position($1::uuid[], j.id)]
      AND j.status COLLATE "C" = 'queued'
      AND j.published_at IS NULL
      AND j.run_at <= now()
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobq.job j
SET published_at = now()
WHERE j.id = ANY(ARRAY(SELECT target.id FROM target));  -- once, not a join

-- name: relay_take
-- Reaper relay, inside a transaction that stays open until the broker
-- confirmed: the rows are locked, so a consumer that receives the id early
-- waits on the row lock (the row is already 'queued') instead of missing it.
SELECT id, queue
FROM jobq.job
WHERE status = 'queued' AND published_at IS NULL AND relay_after <= now()
ORDER BY relay_after
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: relay_defer
-- Rows the broker would not take now (their queue cannot be declared, or the
-- publish failed): try them again later, so they never sit at the head of
-- every relay batch and starve the other queues' rows.
UPDATE jobq.job
SET relay_after = now() + make_interval(secs => $2)
WHERE id = ANY($1::uuid[]) AND status COLLATE "C" = 'queued' AND published_at IS NULL;

-- name: relay_mark
WITH marked AS (
    UPDATE jobq.job j SET published_at = now()
    FROM jobq.queue q
    WHERE j.id = ANY($1::uuid[]) AND q.name = j.queue
    RETURNING j.id, q.history
)
INSERT INTO jobq.job_event (job_id, event, detail)
SELECT id, 'published', 'by the reaper relay' FROM marked WHERE history;

-- ───────────────────────────── claim and run ─────────────────────────────

-- name: claim
-- grant: jobq_consumer
-- plan: generic
-- fast: claim_plain
-- queued -> active for every id that is claimable now by a worker handling
-- the queues in $3. Ids missing from the result were not claimable (see
-- claim_misses). Rows are locked in id order, so concurrent batched claims
-- never deadlock; a row another transaction holds (a reaper's open relay
-- transaction) is waited for, then re-checked, never skipped. The lock
-- tokens ($4, one per id) are the consumer's own random UUIDs, so that a
-- claim retried after its reply was lost can recognise the rows it already
-- holds (claim_recover) instead of taking them for someone else's.
--
-- Priorities (issue #30): a delivered id is a claim on its queue's next
-- job, best first. If jobs of a higher priority wait in that queue (due, not
-- parked), the claim takes the best of them instead (SKIP LOCKED: never two
-- claims for one) and hands the delivered job back to be published again
-- (a fresh token; the consumer publishes it, the relay is the fallback).
-- So a priority-5 job starts with the next delivery of its queue, whatever
-- the broker delivered or prefetched before it; the job it overtook goes to
-- the back of the broker queue. `via` says which delivered id each claimed
-- row came for. In a queue with per-key limits, a keyed job is not taken
-- this way (its key's lock is not held): it keeps its place.
--
-- Limits (issues #17, #30): a queue with max_running, rate_per_s or paused
-- is decided here, for the whole fleet. Its row is locked first, in a
-- statement of its own: the function is VOLATILE, so the claim after it
-- takes a fresh snapshot and counts every job the claim that held the lock
-- before made active. Per-key limits (max_running_per_key,
-- rate_per_s_per_key) lock each key of the batch instead (a row of
-- jobq.key_lock per queue and key, made on first use, locked in queue, key
-- order), so keys never wait on each other. A row, not an advisory lock:
-- any login can take an advisory lock, and one that held a key's stalled a
-- whole consumer for 58 s (issue #47); no login can lock jobq.key_lock.
-- Unlimited queues lock nothing. Ids a limit refuses are parked
-- (published_at NULL, relay_after 'infinity', a fresh lock token, so that no
-- late publish mark of the spell before can cover them): their messages are
-- acked, and a finished job's consumer (unpark_freed) or the reapers' unpark
-- release them to the relay as slots and tokens free up, so a full queue or
-- key is neither lost nor spun on, and a key with a backlog holds only its
-- cap's worth of messages in the broker: the fairness between keys.
--
-- Map of the statement (four statements in one call; the last does the work):
--   1. lock the limited queues' rows (queue order)     -> a fresh snapshot
--   2. make the batch's key_lock rows                  (per-key limits only)
--   3. lock them in (queue, key) order                 (per-key limits only)
--   4. aging      the batch's queues with priority aging (schema 0040)
--      by_priority waiting jobs of a priority above 0, best first per queue
--                 (SKIP LOCKED: two claims never take the same one)
--      by_age     in an aging queue, the longest waiting too
--      better     both, per queue, by level now (jobq.aged)
--      delivered  the delivered ids as they are now (read only if `better`)
--      swap       delivered id -> the better job taken in its place
--      candidate  the rows to claim (delivered, swapped), locked in id order,
--                 re-checked under the lock: queued, due, not waiting
--      allowance  per limited queue: how many may start now (cap, tokens)
--      keyed      per key of a per-key-limited queue: the same, per key
--      hold       the candidates whose key (or queue) a RateLimited holds now
--      policy     fifo: an earlier job of the key not ended; latest: a newer
--                 job of the key (schema 0027; fifo and latest jobs only)
--      ranked     each candidate allowed or not, best first within the limits
--                 (a held, a superseded or a fifo job behind another never)
--      claimed    UPDATE: the allowed rows active, token, deadline  -> rows
--      superseded UPDATE: latest jobs with a newer one of their key cancelled
--      parked     UPDATE: the refused rows out of the relay, new token
--      held       UPDATE: held rows delayed to the hold's end, new token
--      handed     UPDATE: swapped-out delivered jobs back in line  -> rows
--      spent      the queues' rate tokens used
--      key_spent  the keys' rate tokens used
--      logged     'claimed' in job_event when the queue keeps history
--   result: claimed rows (handed false) UNION ALL handed rows (handed true)
-- NO KEY UPDATE, so enqueues (their foreign key's KEY SHARE) never wait.
SELECT name FROM jobq.queue
WHERE name = ANY($3::text[]) AND (max_running IS NOT NULL OR rate_per_s IS NOT NULL OR paused)
ORDER BY name
FOR NO KEY UPDATE;
INSERT INTO jobq.key_lock (queue, key)
SELECT DISTINCT j.queue, j.key
FROM jobq.job j JOIN jobq.queue q ON q.name = j.queue
WHERE j.id = ANY($1::uuid[]) AND j.key IS NOT NULL
  AND (q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL)
  AND EXISTS (SELECT 1 FROM jobq.queue pq  -- none of these queues has a per-key
              WHERE pq.name = ANY($3::text[])  -- limit: no job row is read
                AND (pq.max_running_per_key IS NOT NULL OR pq.rate_per_s_per_key IS NOT NULL))
ORDER BY 1, 2
ON CONFLICT (queue, key) DO NOTHING;
SELECT 1
FROM jobq.key_lock l
WHERE (l.queue, l.key) IN (
    SELECT j.queue, j.key
    FROM jobq.job j JOIN jobq.queue q ON q.name = j.queue
    WHERE j.id = ANY($1::uuid[]) AND j.key IS NOT NULL
      AND (q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL)
      AND EXISTS (SELECT 1 FROM jobq.queue pq
                  WHERE pq.name = ANY($3::text[])
                    AND (pq.max_running_per_key IS NOT NULL
                         OR pq.rate_per_s_per_key IS NOT NULL)))
ORDER BY l.queue, l.key
FOR NO KEY UPDATE OF l;
WITH aging AS MATERIALIZED (  -- the batch's queues with priority aging (0040): mostly none
    SELECT q.name, q.priority_aging_s AS s,
           q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL AS per_key
    FROM jobq.queue q
    WHERE q.name = ANY($3::text[]) AND q.priority_aging_s IS NOT NULL
), by_priority AS (  -- waiting jobs of a priority above 0: an empty index when none is used
    SELECT x.id, x.queue, jobq.aged(x.priority, x.run_at, a.s) AS level
    FROM jobq.queue q
    CROSS JOIN LATERAL (
        SELECT x.id, x.queue, x.priority, x.run_at
        FROM jobq.job x
        WHERE x.queue = q.name AND x.status COLLATE "C" = 'queued' AND x.priority > 0
          AND x.run_at <= now() AND x.relay_after < 'infinity'
          AND (x.expires_at IS NULL OR x.expires_at > now() OR x.started_at IS NOT NULL)
          AND x.id <> ALL ($1::uuid[])
          AND (x.key IS NULL
               OR (q.max_running_per_key IS NULL AND q.rate_per_s_per_key IS NULL))
        ORDER BY x.priority DESC, x.id
        LIMIT cardinality($1::uuid[])
        FOR UPDATE OF x SKIP LOCKED) x
    LEFT JOIN aging a ON a.name = q.name
    WHERE q.name = ANY($3::text[])
), by_age AS (  -- priority aging (schema 0040): the longest waiting, whatever their priority
    SELECT y.id, y.queue, jobq.aged(y.priority, y.run_at, a.s) AS level
    FROM aging a
    CROSS JOIN LATERAL (
        SELECT y.id, y.queue, y.priority, y.run_at
        FROM jobq.job y
        WHERE y.id = ANY(ARRAY(  -- among the 64 longest due (job_queued_idx): bounded
                  SELECT o.id FROM jobq.job o
                  WHERE o.queue = a.name AND o.status = 'queued' AND o.run_at <= now()
                  ORDER BY o.run_at LIMIT 64))
          AND y.status COLLATE "C" = 'queued' AND y.run_at <= now()
          AND y.relay_after < 'infinity' AND y.waiting_on = 0
          AND (y.expires_at IS NULL OR y.expires_at > now() OR y.started_at IS NOT NULL)
          AND y.id <> ALL ($1::uuid[])
          AND y.id NOT IN (SELECT p.id FROM by_priority p)  -- once each, without a UNION's
          AND (y.key IS NULL OR NOT a.per_key)              -- sort when nothing ages
        ORDER BY y.run_at, y.id
        LIMIT cardinality($1::uuid[])
        FOR UPDATE OF y SKIP LOCKED) y
), better AS (  -- per queue, best level first
    SELECT b.id, b.queue, b.level,
           row_number() OVER (PARTITION BY b.queue ORDER BY b.level DESC, b.id) AS rk
    FROM (SELECT * FROM by_priority UNION ALL SELECT * FROM by_age) b
), delivered AS (  -- as seen now, for the swap only (read only if something is better)
    SELECT j.id, j.queue, jobq.aged(j.priority, j.run_at, a.s) AS level,
           row_number() OVER (PARTITION BY j.queue
                              ORDER BY jobq.aged(j.priority, j.run_at, a.s), j.id) AS rk
    FROM jobq.job j LEFT JOIN aging a ON a.name = j.queue
    WHERE j.id = ANY($1::uuid[])
      AND j.status COLLATE "C" = 'queued'
      AND j.run_at <= now()
      AND j.queue = ANY($3::text[])
      AND EXISTS (SELECT 1 FROM better)
), swap AS (
    SELECT d.id AS given, b.id AS taken
    FROM delivered d JOIN better b ON b.queue = d.queue AND b.rk = d.rk
    WHERE b.level > d.level
), candidate AS (  -- the claim re-checks every row under its lock; its level (0040)
    SELECT j.id, j.queue, j.key, j.key_policy, j.seq,
           jobq.aged(j.priority, j.run_at, (SELECT a.s FROM aging a WHERE a.name = j.queue))
               AS priority,
           coalesce((SELECT s.given FROM swap s WHERE s.taken = j.id), j.id) AS via
    FROM jobq.job j
    WHERE j.id = ANY (CASE WHEN NOT EXISTS (SELECT 1 FROM swap) THEN $1::uuid[]
                           ELSE ARRAY(SELECT t.id FROM unnest($1::uuid[]) AS t(id)
                                      WHERE t.id NOT IN (SELECT given FROM swap)
                                      UNION ALL
                                      SELECT taken FROM swap) END)
      AND j.status COLLATE "C" = 'queued'
      AND j.run_at <= now()
      AND j.queue = ANY($3::text[])
      AND j.waiting_on = 0  -- a job waiting for others is released by their ends
      AND (j.expires_at IS NULL OR j.expires_at > now()  -- past its deadline unstarted:
           OR j.started_at IS NOT NULL)                   -- the reapers cancel it (0031)
    ORDER BY j.id
    FOR UPDATE OF j
), allowance AS (  -- jobq.allowance and jobq.rate_tokens: schema 0010, 0013
    SELECT q.name, jobq.rate_tokens(q) AS tokens,
           jobq.allowance(q, (SELECT count(*) FROM jobq.job a
                              WHERE a.queue = q.name AND a.status = 'active')) AS n
    FROM jobq.queue q
    WHERE q.name IN (SELECT queue FROM candidate)
      AND (q.max_running IS NOT NULL OR q.rate_per_s IS NOT NULL OR q.paused)
), keyed AS (  -- per key: jobq.key_allowance, jobq.key_tokens (schema 0013)
    SELECT k.queue, k.key, kt.tokens,
           jobq.key_allowance(kt.tier, (SELECT count(*) FROM jobq.job a
                                        WHERE a.queue = k.queue AND a.key = k.key
                                          AND a.status = 'active'), kt.tokens) AS n
    FROM (SELECT DISTINCT c.queue, c.key FROM candidate c WHERE c.key IS NOT NULL) k
    JOIN jobq.queue q ON q.name = k.queue
    LEFT JOIN jobq.key_rate r ON r.queue = k.queue AND r.key = k.key
    CROSS JOIN LATERAL (SELECT t AS tier, jobq.key_tokens(t, r.tokens, r.at) AS tokens
                        FROM jobq.key_tier(q, k.key) t) kt  -- the key's tier (0036)
    WHERE q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL
), hold AS (  -- jobq.RateLimited: the key's (or the whole queue's) hold, if live
    SELECT c.id, max(h.until) AS until
    FROM candidate c
    JOIN jobq.key_hold h ON h.queue = c.queue AND h.key IN ('', coalesce(c.key, ''))
    WHERE h.until > now()
    GROUP BY c.id
), policy AS (  -- key policies (schema 0027): read for fifo and latest jobs only
    SELECT c.id,
           CASE WHEN c.key_policy = 'latest' THEN (
               SELECT n.id FROM jobq.job n  -- the key's newest job, if newer
               WHERE n.queue = c.queue AND n.key = c.key AND n.seq > c.seq
               ORDER BY n.seq DESC LIMIT 1) END AS newer,
           c.key_policy = 'fifo' AND EXISTS (  -- an earlier job of the key not ended, or
               SELECT 1 FROM jobq.job e        -- failed where the queue halts on failure:
               WHERE e.queue = c.queue AND e.key = c.key AND e.seq < c.seq  -- by
                 AND e.seq IS NOT NULL             -- job_key_open_seq_idx (0041)
                 AND e.status IN ('queued', 'active', 'failed')
                 AND (e.status <> 'failed' OR (SELECT hq.halt_on_failure FROM jobq.queue hq
                                               WHERE hq.name = c.queue))) AS behind
    FROM candidate c
    WHERE c.seq IS NOT NULL
), ranked AS (
    SELECT c.id, c.queue, c.key, c.via, hd.until AS held_until, pl.newer,
           hd.until IS NULL AND pl.newer IS NULL AND NOT coalesce(pl.behind, false)
           AND (a.n IS NULL OR row_number() OVER (
               PARTITION BY c.queue ORDER BY hd.until IS NOT NULL, c.priority DESC, c.id) <= a.n)
           AND (k.n IS NULL OR row_number() OVER (
               PARTITION BY c.queue, c.key ORDER BY hd.until IS NOT NULL, c.priority DESC, c.id)
                <= k.n) AS allowed
    FROM candidate c
    LEFT JOIN allowance a ON a.name = c.queue
    LEFT JOIN keyed k ON k.queue = c.queue AND k.key = c.key
    LEFT JOIN hold hd ON hd.id = c.id
    LEFT JOIN policy pl ON pl.id = c.id
), claimed AS (
    UPDATE jobq.job j
    SET status = 'active',
        -- the token sent at the delivered id's (first) position: same plan as by id alone
        lock = ($4::uuid[])[array_position($1::uuid[], ranked.via)],
        worker_id = $2,
        attempts = j.attempts + 1,
        lease_expires_at = now() + make_interval(secs => q.lease_s),
        started_at = now(),
        isolated = false
    FROM ranked, jobq.queue q
    WHERE j.id = ANY(ARRAY(SELECT r.id FROM ranked r WHERE r.allowed))  -- by id, always
      AND j.id = ranked.id AND ranked.allowed
      AND q.name = j.queue
      AND (j.expires_at IS NULL OR j.expires_at > clock_timestamp()  -- the deadline once
           OR j.started_at IS NOT NULL)                 -- the row is ours (see claim_plain)
    RETURNING j.id, j.queue, j.payload, j.attempts, j.errors, j.stalls, j.lock, j.created_at,
              j.suspect, j.handoffs, q.lease_s, q.timeout_s, q.max_attempts,
              q.vanished_grace_s, q.history, q.max_result_bytes,
              q.max_running IS NOT NULL OR q.rate_per_s IS NOT NULL
                  OR q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL
                  OR j.key_policy = 'fifo' AS limited,
              ranked.via, false AS handed, j.key
), superseded AS (  -- latest: a newer job of the key exists; never run, cancelled
    UPDATE jobq.job j
    SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL,
        last_error = format('superseded by job %s (key policy latest)', ranked.newer)
    FROM ranked
    WHERE j.id = ANY(ARRAY(SELECT r.id FROM ranked r WHERE r.newer IS NOT NULL))
      AND j.id = ranked.id AND ranked.newer IS NOT NULL
    RETURNING j.id, j.queue, j.last_error
), parked AS (  -- a new queued spell, with a token of its own: a publish mark
    UPDATE jobq.job j  -- for the spell before (the producer's, late) misses it
    SET published_at = NULL, relay_after = 'infinity', lock = gen_random_uuid()
    FROM ranked
    WHERE j.id = ANY(ARRAY(SELECT r.id FROM ranked r
                           WHERE NOT r.allowed AND r.held_until IS NULL
                             AND r.newer IS NULL))
      AND j.id = ranked.id AND NOT ranked.allowed AND ranked.held_until IS NULL
      AND ranked.newer IS NULL
), held AS (  -- held by a RateLimited: due when the hold ends, published by the relay
    UPDATE jobq.job j
    SET run_at = ranked.held_until, relay_after = ranked.held_until, published_at = NULL,
        lock = gen_random_uuid()
    FROM ranked
    WHERE j.id = ANY(ARRAY(SELECT r.id FROM ranked r WHERE r.held_until IS NOT NULL))
      AND j.id = ranked.id AND ranked.held_until IS NOT NULL
), handed AS (  -- overtaken by a higher priority: published again, new spell
    UPDATE jobq.job j
    SET published_at = NULL, relay_after = now(), lock = gen_random_uuid()
    FROM swap s
    WHERE j.id = ANY(ARRAY(SELECT w.given FROM swap w)) AND j.id = s.given
      AND j.status COLLATE "C" = 'queued'
    RETURNING j.id, j.queue, j.lock
), spent AS (
    UPDATE jobq.queue q
    SET rate_tokens = a.tokens - (SELECT count(*) FROM claimed c WHERE c.queue = q.name),
        rate_at = now()
    FROM allowance a
    WHERE q.name = a.name AND q.rate_per_s IS NOT NULL
), key_spent AS (
    INSERT INTO jobq.key_rate (queue, key, tokens, at)
    SELECT k.queue, k.key,
           k.tokens - (SELECT count(*) FROM claimed c WHERE c.queue = k.queue AND c.key = k.key),
           now()
    FROM keyed k WHERE k.tokens IS NOT NULL
    ON CONFLICT (queue, key) DO UPDATE SET tokens = excluded.tokens, at = excluded.at
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, 'claimed', $2, attempts, NULL FROM claimed WHERE history
    UNION ALL
    SELECT s.id, 'superseded', $2, NULL, s.last_error
    FROM superseded s JOIN jobq.queue q ON q.name = s.queue WHERE q.history
)
SELECT id, queue, payload, attempts, errors, stalls, lock, created_at, suspect, handoffs,
       lease_s, timeout_s, max_attempts, vanished_grace_s, history, max_result_bytes,
       limited, via, handed, key
FROM claimed
UNION ALL
SELECT h.id, h.queue, NULL, NULL, NULL, NULL, h.lock, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, h.id, true, NULL
FROM handed h;

-- name: claim_plain
-- The claim's lean path (sql.py, "-- fast:"): when none of the worker's
-- queues has a limit or a pause and none holds a waiting job of a priority
-- above 0 (one probe each of the queue table and of job_priority_idx), the
-- delivered ids are claimed as they always were, by the one statement below,
-- with none of the flow-control nodes: an unlimited queue that uses no
-- priority pays for flow control the two probes and nothing else. The
-- result has the claim's columns. A limit set or a priority job published
-- while this runs applies from the next claim on. The update takes the
-- locked candidates as one array (an init plan), not as a join: joined,
-- each row's index probe carried the whole batch again (#49).
SELECT NOT EXISTS (
           SELECT 1 FROM jobq.queue q
           WHERE q.name = ANY($3::text[])
             AND (q.max_running IS NOT NULL OR q.rate_per_s IS NOT NULL OR q.paused
                  OR q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL
                  OR q.key_policy <> 'queue'))
       AND NOT EXISTS (
           SELECT 1 FROM jobq.job x
           WHERE x.queue = ANY($3::text[]) AND x.status COLLATE "C" = 'queued'
             AND x.priority > 0)
       AND NOT EXISTS (  -- a live RateLimited hold (schema 0026): one index probe
           SELECT 1 FROM jobq.key_hold h
           WHERE h.queue = ANY($3::text[]) AND h.until > now());
WITH candidate AS MATERIALIZED (
    SELECT j.id
    FROM jobq.job j
    WHERE j.id = ANY($1::uuid[])
      AND j.status COLLATE "C" = 'queued'
      AND j.run_at <= now()
      AND j.queue = ANY($3::text[])
      AND j.waiting_on = 0  -- a job waiting for others is released by their ends
      AND (j.expires_at IS NULL OR j.expires_at > now()  -- past its deadline unstarted:
           OR j.started_at IS NOT NULL)                   -- the reapers cancel it (0031)
    ORDER BY j.id
    FOR UPDATE OF j
), claimed AS (
    UPDATE jobq.job j
    SET status = 'active',
        lock = ($4::uuid[])[array_position($1::uuid[], j.id)],
        worker_id = $2,
        attempts = j.attempts + 1,
        lease_expires_at = now() + make_interval(secs => q.lease_s),
        started_at = now(),
        isolated = false
    FROM jobq.queue q
    WHERE j.id = ANY(ARRAY(SELECT c.id FROM candidate c)) AND q.name = j.queue
      -- The deadline again, by the clock, now that the row is ours: now() is
      -- when this transaction began, and a claim that waited for the row (a
      -- relay's open transaction, a reaper frozen holding it) past the
      -- deadline would start the job late. Missed, it stays queued for the
      -- reapers to cancel as expired.
      AND (j.expires_at IS NULL OR j.expires_at > clock_timestamp()
           OR j.started_at IS NOT NULL)
    RETURNING j.id, j.queue, j.payload, j.attempts, j.errors, j.stalls, j.lock, j.created_at,
              j.suspect, j.handoffs, q.lease_s, q.timeout_s, q.max_attempts,
              q.vanished_grace_s, q.history, q.max_result_bytes, false AS limited,
              j.id AS via, false AS handed, j.key
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt)
    SELECT id, 'claimed', $2, attempts FROM claimed WHERE history
)
SELECT * FROM claimed;

-- name: claim_recover
-- grant: jobq_consumer
-- A claim retried after an error: rows this worker already claimed with
-- these very tokens (the first attempt committed, its reply was lost), as
-- claim returns them. Without it the retry saw them "active", dropped the
-- messages as duplicates, and the jobs waited a whole lease. A row claimed
-- in place of a delivered id (a higher priority) carries that id's token:
-- it is found by the token among this worker's active rows.
SELECT j.id, j.queue, j.payload, j.attempts, j.errors, j.stalls, j.lock, j.created_at,
       j.suspect, j.handoffs, q.lease_s, q.timeout_s, q.max_attempts, q.vanished_grace_s,
       q.history, q.max_result_bytes,
       q.max_running IS NOT NULL OR q.rate_per_s IS NOT NULL
           OR q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL AS limited,
       t.id AS via, false AS handed, j.key
FROM jobq.job j
JOIN unnest($1::uuid[], $2::uuid[]) AS t(id, lock) ON j.lock = t.lock
JOIN jobq.queue q ON q.name = j.queue
WHERE j.status = 'active' AND j.worker_id = $3 AND j.lease_expires_at > now();

-- name: claim_misses
-- grant: jobq_consumer
-- Why ids could not be claimed: for the log line and counters only.
SELECT id, queue, status, run_at > now() AS not_due,
       relay_after = 'infinity' AND waiting_on = 0 AS parked, waiting_on > 0 AS waiting,
       coalesce(expires_at <= now() AND started_at IS NULL, false) AS expired
FROM jobq.job
WHERE id = ANY($1::uuid[]);

-- name: renew
-- grant: jobq_consumer
-- plan: generic
-- The heartbeat: one statement for every lease the process holds, sent on
-- the worker's registry session (the one holding its advisory lock), so a
-- successful renewal also proves that session alive. It only touches
-- lease_expires_at, which no index mentions, so it is a HOT update.
-- It never waits for a row lock (I11): a row another transaction holds
-- right now (an operator's, a reaper's, this worker's own completion) is
-- skipped and answered busy (renewed false), and the heartbeat tries it
-- again soon; one locked row once held this statement, and every lease of
-- the worker with it. Ids left out are lost leases. Each row is found by
-- its id (id = ANY: one plan, an index lookup, whatever the statistics).
-- A job of a latest queue whose key has a newer job (schema 0027) is not
-- renewed but cancelled here, by its own worker's statement, so that the
-- producer of the newer job never writes, nor waits on, this row (I11): its
-- id is left out (the worker stops the handler as for a lost lease) and any
-- later write of the run is refused. Each lease's token and length are
-- read from the arrays by its id's position: joined as unnest(), the batch
-- was rescanned once per lease (#49, test_batch_work.py).
WITH mine AS (
    SELECT j.id, ($3::float8[])[array_position($1::uuid[], j.id)] AS lease_s,
           CASE WHEN j.key_policy = 'latest' THEN (
               SELECT n.id FROM jobq.job n
               WHERE n.queue = j.queue AND n.key = j.key AND n.seq > j.seq
               ORDER BY n.seq DESC LIMIT 1) END AS newer
    FROM jobq.job j
    WHERE j.id = ANY($1::uuid[])
      AND j.lock = ($2::uuid[])[array_position($1::uuid[], j.id)]
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE jobq.job j
    SET lease_expires_at = CASE WHEN mine.newer IS NULL
                                THEN now() + make_interval(secs => mine.lease_s) END,
        status = CASE WHEN mine.newer IS NULL THEN j.status ELSE 'cancelled' END,
        finished_at = CASE WHEN mine.newer IS NULL THEN j.finished_at ELSE now() END,
        last_error = CASE WHEN mine.newer IS NULL THEN j.last_error
                          ELSE format('superseded by job %s (key policy latest)', mine.newer) END
    FROM mine
    WHERE j.id = ANY($1::uuid[]) AND j.id = mine.id
    RETURNING j.id, mine.newer IS NULL AS renewed, j.queue, j.worker_id, j.attempts,
              j.last_error
), superseded AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT r.id, 'superseded', r.worker_id, r.attempts, r.last_error
    FROM renewed r JOIN jobq.queue q ON q.name = r.queue
    WHERE NOT r.renewed AND q.history
), seen AS (
    UPDATE jobq.worker SET last_seen_at = now()
    WHERE worker_id = $4 AND backend_pid = pg_backend_pid()
)
SELECT r.id, true AS renewed FROM renewed r WHERE r.renewed
UNION ALL
SELECT j.id, false AS renewed
FROM jobq.job j
WHERE j.id = ANY($1::uuid[])
  AND j.lock = ($2::uuid[])[array_position($1::uuid[], j.id)]
  AND j.status COLLATE "C" = 'active'
  AND j.lease_expires_at > now()
  AND j.id <> ALL (ARRAY(SELECT m.id FROM mine m));  -- once, not a rescan per row

-- ───────────────────────────── run and finish ─────────────────────────────

-- name: complete
-- grant: jobq_consumer
-- plan: generic
-- $3: each job's result (the handler's return value as JSON, NULL for
-- None), stored by the same fenced statement: a zombie's never lands.
-- No history row: a completed row never changes again, and jobq.history
-- shows its 'completed' from it (schema 0011). A job of a latest queue
-- whose key has a newer job by now is not completed but cancelled, its
-- result dropped (schema 0027): no superseded completion is accepted, even
-- one that lands before its renewal would have stopped it; its id is left
-- out, so the worker takes it as lost. The subquery runs for those jobs only.
-- Rows are locked in id order first (locked), whatever scan the update's
-- plan takes: on a table the planner thought tiny it scanned in physical
-- order and deadlocked with the reapers' id-ordered cut of a vanished
-- worker's leases (bench/nemesis.py seed 5201; test_lock_order.py); the
-- update reads that step's result once (an init plan), so it writes rows
-- only once all are locked. Each row's token and result are taken from the
-- arrays by its id's position. Joined to the batch (unnest(), or the locked
-- rows), the plan rescanned it once per row: 4,032 rows filtered away for
-- 64 jobs, work in the batch squared (#49).
WITH locked AS MATERIALIZED (  -- id order whatever the plan (see lock_order below)
    SELECT j.id FROM jobq.job j WHERE j.id = ANY($1::uuid[]) ORDER BY j.id
    FOR NO KEY UPDATE OF j
), done AS (
    UPDATE jobq.job j
    SET status = CASE WHEN j.key_policy = 'latest' THEN
                     CASE WHEN EXISTS (SELECT 1 FROM jobq.job n
                                       WHERE n.queue = j.queue AND n.key = j.key
                                         AND n.seq > j.seq)
                          THEN 'cancelled' ELSE 'completed' END
                     ELSE 'completed' END,
        lease_expires_at = NULL,
        finished_at = now(),
        result = CASE WHEN j.key_policy = 'latest' THEN
                     CASE WHEN EXISTS (SELECT 1 FROM jobq.job n
                                       WHERE n.queue = j.queue AND n.key = j.key
                                         AND n.seq > j.seq)
                          THEN NULL ELSE ($3::jsonb[])[array_position($1::uuid[], j.id)] END
                     ELSE ($3::jsonb[])[array_position($1::uuid[], j.id)] END,
        last_error = CASE WHEN j.key_policy = 'latest' THEN
                         coalesce((SELECT format('superseded by job %s (key policy latest)', n.id)
                                   FROM jobq.job n
                                   WHERE n.queue = j.queue AND n.key = j.key AND n.seq > j.seq
                                   ORDER BY n.seq DESC LIMIT 1), j.last_error)
                         ELSE j.last_error END
    WHERE j.id = ANY($1::uuid[])  -- an index lookup whatever the statistics (issue #49)
      AND (SELECT count(*) FROM locked) > 0  -- once, before the first row is written
      AND j.lock = ($2::uuid[])[array_position($1::uuid[], j.id)]
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
    RETURNING j.id, j.status, j.queue, j.worker_id, j.attempts, j.last_error
), superseded AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT d.id, 'superseded', d.worker_id, d.attempts, d.last_error
    FROM done d JOIN jobq.queue q ON q.name = d.queue
    WHERE d.status = 'cancelled' AND q.history
)
SELECT id FROM done WHERE status = 'completed';

-- name: finished_by
-- grant: jobq_consumer
-- After a fenced write matched nothing: did *this* token already finish the
-- job (a retried write whose first reply was lost)?
SELECT j.id, j.status
FROM jobq.job j
JOIN unnest($1::uuid[], $2::uuid[]) AS t(id, lock) ON j.id = t.id AND j.lock = t.lock
WHERE j.id = ANY($1::uuid[]);

-- name: progress
-- grant: jobq_consumer
-- job.progress(value): fenced like every worker write (zero rows: lost).
-- The worker writes at most once a second per job (worker/progress.py).
UPDATE jobq.job j
SET progress = $3::jsonb, progress_at = now()
WHERE j.id = $1
  AND j.lock = $2
  AND j.status COLLATE "C" = 'active'
  AND j.lease_expires_at > now()
RETURNING j.id;

-- name: output_emit
-- grant: jobq_consumer
-- job.emit(chunk) (schema 0033): the next chunk of the job ($3, JSON), from
-- the holder of its live lease only ($2), at most the queue's
-- max_payload_bytes and $4 chunks a job. ours false: the lease is lost; n
-- NULL while ours: refused (too large, or the cap; `before` says which).
-- The worker sends one emit of a job at a time, so n is free.
WITH mine AS (
    SELECT j.id, j.attempts, q.max_payload_bytes
    FROM jobq.job j JOIN jobq.queue q ON q.name = j.queue
    WHERE j.id = $1 AND j.lock = $2
      AND j.status COLLATE "C" = 'active' AND j.lease_expires_at > now()
), prev AS (
    SELECT coalesce(max(o.n), 0) AS n FROM jobq.job_output o WHERE o.job_id = $1
), added AS (
    INSERT INTO jobq.job_output (job_id, n, run, attempt, chunk)
    SELECT m.id, p.n + 1, $2, m.attempts, $3::jsonb
    FROM mine m, prev p
    WHERE octet_length($3::text) <= m.max_payload_bytes AND p.n < $4
    RETURNING job_id, n
)
SELECT EXISTS (SELECT 1 FROM mine) AS ours,
       (SELECT a.n FROM added a WHERE pg_notify('jobq_output', a.job_id::text) IS NOT NULL) AS n,
       (SELECT p.n FROM prev p) AS before;

-- name: parents
-- grant: jobq_consumer
-- await job.parents(): the jobs this one waited for, with their results.
-- Only for the holder of its live lease (a token alone, kept by the row
-- after the run, is not enough); a pruned parent is missing.
SELECT p.id, p.status, p.result
FROM jobq.job j
JOIN jobq.job_dependency d ON d.job_id = j.id
JOIN jobq.job p ON p.id = d.parent_id
WHERE j.id = $1 AND j.lock = $2
  AND j.status COLLATE "C" = 'active' AND j.lease_expires_at > now();

-- name: step_get
-- grant: jobq_consumer
-- await job.step(name, fn): the step as a run of this job recorded it, if
-- it did. Only for the holder of its live lease.
SELECT s.fn, s.result
FROM jobq.job_step s JOIN jobq.job j ON j.id = s.job_id
WHERE s.job_id = $1 AND j.lock = $2 AND s.name = $3
  AND j.status COLLATE "C" = 'active' AND j.lease_expires_at > now();

-- name: step_names
-- grant: jobq_consumer
-- A run's first job.step (or sleep, wait): the names and functions of every
-- step the job recorded, not their results, so that each later lookup that
-- misses costs no statement: a fresh run's 20 steps are 21 statements, not
-- 40 (bench/suspension_cost.py). Only for the holder of its live lease.
SELECT s.name, s.fn
FROM jobq.job_step s JOIN jobq.job j ON j.id = s.job_id
WHERE s.job_id = $1 AND j.lock = $2
  AND j.status COLLATE "C" = 'active' AND j.lease_expires_at > now();

-- name: step_record
-- grant: jobq_consumer
-- Record a step's result, fenced like every worker write: only while this
-- token holds the lease, so a zombie's step never lands (no row: lost, or
-- recorded already by this very run, which step_get then says).
INSERT INTO jobq.job_step (job_id, name, fn, result, attempt)
SELECT j.id, $3, $4, $5::jsonb, j.attempts
FROM jobq.job j
WHERE j.id = $1 AND j.lock = $2 AND j.status COLLATE "C" = 'active'
  AND j.lease_expires_at > now()
ON CONFLICT (job_id, name) DO NOTHING
RETURNING name;

-- name: signal
-- client.signal / jobq signal (issue #52): jobq.signal(id, name, payload),
-- schema 0028; inside the caller's transaction when it passes its own.
SELECT jobq.signal($1::uuid, $2::text, $3::jsonb);

-- name: output_read
-- grant: jobq_producer, jobq_reader
-- client.stream (schema 0033): where the job is, and up to $3 of its chunks
-- after offset $2, in order. The status is read first: once it is terminal
-- no chunk can follow (an emit needs a live lease), so a reader that got
-- fewer than $3 chunks with a terminal status has them all. No row: no job.
SELECT j.status,
       coalesce((SELECT json_agg(json_build_object('n', o.n, 'run', o.run, 'attempt', o.attempt,
                                                   'chunk', o.chunk) ORDER BY o.n)
                 FROM (SELECT * FROM jobq.job_output o
                       WHERE o.job_id = j.id AND o.n > $2
                       ORDER BY o.n LIMIT $3) o), '[]')::text AS chunks
FROM jobq.job j
WHERE j.id = $1;

-- name: watch
-- grant: jobq_producer
-- client.result / jobq wait: watch the job (a row of the waiter's own in
-- jobq.job_watch: its end then sends a NOTIFY on jobq_finished, trigger in
-- schema 0024) and read where it is. The job's row is not written: a
-- waiter's open transaction must not hold a lock its worker waits on (I11).
-- An end whose trigger ran just before this commit and that commits just
-- after this read sends no NOTIFY: the waiter re-reads now and then
-- (results.py), so that rare end is seen within that interval.
WITH watched AS (
    INSERT INTO jobq.job_watch (job_id)
    SELECT j.id FROM jobq.job j WHERE j.id = $1
    ON CONFLICT (job_id) DO NOTHING
)
SELECT j.id, j.status, j.result, j.last_error, j.last_traceback
FROM jobq.job j
WHERE j.id = $1;

-- name: fail
-- grant: jobq_consumer
-- plan: generic
-- Handler error: back to queued after a backoff while fewer than
-- max_attempts runs have failed (and retry = true), else failed. The retry is
-- published by the reaper's relay once run_at comes (published_at = NULL,
-- relay_after = run_at). Backoff: backoff_base_s * 2^(errors so far).
-- $6: the failures' tracebacks (schema 0025), kept in last_traceback. $7,
-- $8, $9: each handler's own max_attempts, backoff_base_s and backoff_max_s
-- (runtime/retries.py), NULL for the queue's: one backoff rule, here.
-- optional: $6
-- Rows locked in id order first, as complete's.
WITH locked AS MATERIALIZED (  -- id order whatever the plan (see lock_order below)
    SELECT j.id FROM jobq.job j WHERE j.id = ANY($1::uuid[]) ORDER BY j.id
    FOR NO KEY UPDATE OF j
), failed AS (
    UPDATE jobq.job j
    SET errors = j.errors + 1,
        -- each job's own values, read from the arrays by its id's position
        -- in a subquery of the row (no join: joined, the batch was rescanned
        -- once per row, #49)
        (status, run_at, relay_after, finished_at) = (
            SELECT CASE WHEN f.again THEN 'queued' ELSE 'failed' END,
                   CASE WHEN f.again THEN f.retry_at ELSE j.run_at END,
                   CASE WHEN f.again THEN f.retry_at ELSE j.relay_after END,
                   CASE WHEN f.again THEN NULL ELSE now() END
            FROM (SELECT ($4::bool[])[p.i]
                             AND j.errors + 1 < coalesce(($7::int[])[p.i], q.max_attempts)
                             AS again,
                         now() + make_interval(secs => coalesce(($5::float8[])[p.i], least(
                             coalesce(($9::float8[])[p.i], q.backoff_max_s),
                             coalesce(($8::float8[])[p.i], q.backoff_base_s)
                                 * power(2, j.errors)))) AS retry_at
                  FROM (SELECT array_position($1::uuid[], j.id) AS i) p) f),
        last_error = ($3::text[])[array_position($1::uuid[], j.id)],
        last_traceback = ($6::text[])[array_position($1::uuid[], j.id)],
        lease_expires_at = NULL,
        published_at = NULL,
        suspect = false  -- it ran and returned an error: it does not crash workers
    FROM jobq.queue q
    WHERE j.id = ANY($1::uuid[])
      AND (SELECT count(*) FROM locked) > 0  -- once, before the first row is written
      AND j.lock = ($2::uuid[])[array_position($1::uuid[], j.id)]
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
      AND q.name = j.queue
    RETURNING j.id, j.status, j.worker_id, j.attempts, j.last_error, j.run_at, q.history
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, CASE WHEN status = 'queued' THEN 'retry' ELSE 'failed' END, worker_id,
           attempts, CASE WHEN status = 'queued'
                          THEN format('%s; retry at %s', last_error, run_at)
                          ELSE last_error END
    FROM failed WHERE history
)
SELECT id, status, extract(epoch FROM run_at - now())::float8 AS retry_in_s FROM failed;

-- name: snooze
-- grant: jobq_consumer
-- jobq.Snooze / jobq.RateLimited (issue #51, schema 0026): the run ends
-- without counting: back to queued after $3 seconds with attempts - 1 (the
-- claim counted the run), snoozes + 1, no error recorded, published by the
-- relay when due. $4 (RateLimited): also hold the job's key (the whole queue,
-- key '', when it has none) until then, fleet-wide: the claim refuses its
-- jobs meanwhile. A job snoozed $5 times already fails instead
-- (errors.MAX_SNOOZES): nothing snoozes forever by mistake. Fenced by the
-- lease like every worker write; expired holds of the queue are dropped here.
WITH mine AS (
    SELECT j.id, j.queue, coalesce(j.key, '') AS hold_key, j.snoozes >= $5 AS spent,
           now() + make_interval(secs => $3::float8) AS until
    FROM jobq.job j
    WHERE j.id = $1
      AND j.lock = $2
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
    FOR NO KEY UPDATE OF j
), held AS (
    INSERT INTO jobq.key_hold AS h (queue, key, until)
    SELECT m.queue, m.hold_key, m.until FROM mine m WHERE $4 AND NOT m.spent
    ON CONFLICT (queue, key) DO UPDATE SET until = greatest(h.until, excluded.until)
), expired AS (
    DELETE FROM jobq.key_hold h
    WHERE $4 AND h.queue = (SELECT queue FROM mine) AND h.until < now() - interval '1 minute'
), snoozed AS (
    UPDATE jobq.job j
    SET status = CASE WHEN m.spent THEN 'failed' ELSE 'queued' END,
        attempts = CASE WHEN m.spent THEN j.attempts ELSE greatest(j.attempts - 1, 0) END,
        snoozes = j.snoozes + CASE WHEN m.spent THEN 0 ELSE 1 END,
        errors = j.errors + CASE WHEN m.spent THEN 1 ELSE 0 END,
        last_error = CASE WHEN m.spent THEN format('snoozed %s times: the cap (jobq.Snooze)', $5)
                          ELSE j.last_error END,
        lease_expires_at = NULL,
        run_at = CASE WHEN m.spent THEN j.run_at ELSE m.until END,
        relay_after = CASE WHEN m.spent THEN j.relay_after ELSE m.until END,
        published_at = NULL,
        suspect = false,
        finished_at = CASE WHEN m.spent THEN now() END
    FROM mine m
    WHERE j.id = $1 AND j.id = m.id
    RETURNING j.id, j.queue, j.status, j.worker_id, j.attempts, j.snoozes, j.run_at,
              j.last_error
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT s.id, CASE WHEN s.status = 'failed' THEN 'failed'
                      WHEN $4 THEN 'rate_limited' ELSE 'snoozed' END,
           s.worker_id, s.attempts + CASE WHEN s.status = 'failed' THEN 0 ELSE 1 END,
           CASE WHEN s.status = 'failed' THEN s.last_error
                ELSE format('%s; until %s', $6::text, s.run_at) END
    FROM snoozed s JOIN jobq.queue q ON q.name = s.queue
    WHERE q.history
)
SELECT id, status, snoozes, extract(epoch FROM run_at - now())::float8 AS retry_in_s
FROM snoozed;

-- name: suspend
-- grant: jobq_consumer
-- job.sleep / job.wait_for (issue #52, schema 0028): the run ends without
-- counting (attempts - 1: the claim counted it), the job goes back to
-- queued with no lease and no slot (I12), due at $3 (epoch seconds, the
-- database's clock; NULL: no timer). $4: the signal it waits for, if any:
-- already in the mailbox, the job is due now; otherwise the reapers' wake
-- duty makes it due when the signal comes. $6: the children it joins
-- (schema 0029): all ended already, due now; otherwise the wake duty.
-- Never relay_after 'infinity' (that is a parked job). Fenced by the lease
-- like every worker write.
WITH mine AS (
    SELECT j.id,
           $4::text IS NOT NULL AND EXISTS (
               SELECT 1 FROM jobq.job_signal g WHERE g.job_id = j.id AND g.name = $4)
           OR $6::uuid[] IS NOT NULL AND NOT EXISTS (  -- job.join: every child ended
               SELECT 1 FROM jobq.job c WHERE c.id = ANY($6::uuid[])
                 AND c.status IN ('queued', 'active')) AS ready
    FROM jobq.job j
    WHERE j.id = $1
      AND j.lock = $2
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
    FOR NO KEY UPDATE OF j
), parked AS (
    UPDATE jobq.job j
    SET status = 'queued',
        attempts = greatest(j.attempts - 1, 0),
        lease_expires_at = NULL,
        published_at = NULL,
        suspect = false,
        suspended_at = now(),  -- what it waits for and since when (schema 0038)
        wake_on = $4,
        joining = CASE WHEN m.ready THEN NULL ELSE $6::uuid[] END,
        run_at = CASE WHEN m.ready THEN now()
                      ELSE coalesce(to_timestamp($3::float8), now() + interval '100 years') END,
        relay_after = CASE WHEN m.ready THEN now()
                           ELSE coalesce(to_timestamp($3::float8),
                                         now() + interval '100 years') END
    FROM mine m
    WHERE j.id = $1 AND j.id = m.id
    RETURNING j.id, j.queue, j.status, j.worker_id, j.attempts, j.run_at
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT p.id, 'suspended', p.worker_id, p.attempts + 1, $5::text
    FROM parked p JOIN jobq.queue q ON q.name = p.queue
    WHERE q.history
)
SELECT id, status, attempts, run_at FROM parked;

-- name: spawn
-- grant: jobq_consumer
-- job.spawn (schema 0029): the child named $3 of the running job $1 (token
-- $2), made once: a step 'spawn:<name>' records its id in the same
-- statement as the child's insert (jobq.enqueue, published by the relay), so
-- a parent killed right after spawning finds the child recorded and a crash
-- before the commit made neither. $4 queue, $5 payload, $6 delay_s, $7
-- priority, $8 key. Returns the child's id; no row: the lease is lost.
WITH holder AS (
    SELECT j.id FROM jobq.job j
    WHERE j.id = $1 AND j.lock = $2 AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
), recorded AS (
    SELECT (s.result #>> '{}')::uuid AS id FROM jobq.job_step s, holder h
    WHERE s.job_id = h.id AND s.name = 'spawn:' || $3
), made AS (
    SELECT jobq.enqueue(queue => $4::text, payload => $5::jsonb, delay_s => $6::float8,
                        priority => $7::int, key => $8::text) AS id
    FROM holder WHERE NOT EXISTS (SELECT 1 FROM recorded)
), noted AS (
    INSERT INTO jobq.job_step (job_id, name, fn, result, attempt)
    SELECT $1, 'spawn:' || $3, 'jobq.spawn', to_jsonb(m.id::text), j.attempts
    FROM made m, jobq.job j WHERE j.id = $1
)
SELECT id FROM recorded UNION ALL SELECT id FROM made;

-- name: join_results
-- grant: jobq_consumer
-- job.join: the children's statuses, results and errors, for the holder of
-- the parent's live lease (the ids it passed), and whether this job spawned
-- each (its steps 'spawn:<name>'): a job joins only its own children, not
-- another queue's or another login's jobs. One row at least: held false,
-- the lease is lost; id NULL, no such job.
WITH holder AS (
    SELECT EXISTS (SELECT 1 FROM jobq.job j
                   WHERE j.id = $1 AND j.lock = $2 AND j.status COLLATE "C" = 'active'
                     AND j.lease_expires_at > now()) AS held
)
SELECT h.held, c.id, c.status, c.result::text AS result, c.last_error,
       EXISTS (SELECT 1 FROM jobq.job_step s
               WHERE s.job_id = $1 AND s.fn = 'jobq.spawn'
                 AND (s.result #>> '{}') = c.id::text) AS spawned
FROM holder h
LEFT JOIN jobq.job c ON c.id = ANY($3::uuid[]) AND h.held;

-- name: signal_get
-- grant: jobq_consumer
-- job.wait_for: the signal of that name sent to this job, if any (its
-- payload as JSON text), for the holder of the live lease; marked
-- delivered, so the reapers' wake duty no longer looks at it.
UPDATE jobq.job_signal s
SET delivered = true
FROM jobq.job j
WHERE s.job_id = $1 AND s.name = $3
  AND j.id = s.job_id AND j.lock = $2
  AND j.status COLLATE "C" = 'active' AND j.lease_expires_at > now()
RETURNING s.payload::text;

-- name: release
-- grant: jobq_consumer
-- plan: generic
-- Graceful shutdown (or a suspect handed on by a busy worker): give the job
-- back at once, without counting a stall or an error. The releasing worker publishes the id itself; the relay is the
-- fallback (relay_after = now()). Rows locked in id order first, and the
-- tokens read by position, as complete's.
WITH locked AS MATERIALIZED (  -- id order whatever the plan (see lock_order below)
    SELECT j.id FROM jobq.job j WHERE j.id = ANY($1::uuid[]) ORDER BY j.id
    FOR NO KEY UPDATE OF j
), released AS (
    UPDATE jobq.job j
    SET status = 'queued',
        lease_expires_at = NULL,
        run_at = now(),
        relay_after = now(),
        published_at = NULL,
        isolated = false,
        handoffs = j.handoffs + CASE WHEN $4 THEN 1 ELSE 0 END
    FROM jobq.queue q
    WHERE j.id = ANY($1::uuid[])
      AND (SELECT count(*) FROM locked) > 0  -- once, before the first row is written
      AND j.lock = ($2::uuid[])[array_position($1::uuid[], j.id)]
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
      AND q.name = j.queue
    RETURNING j.id, j.queue, j.lock, j.worker_id, j.attempts, q.history
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, 'released', worker_id, attempts, $3 FROM released WHERE history
)
SELECT id, queue, lock FROM released;

-- ───────────────────────────── reap ─────────────────────────────

-- name: requeue_lapsed
-- The reaper's half of the lease. SKIP LOCKED makes reapers symmetric peers:
-- a row another reaper is handling is skipped, and a row it already requeued
-- fails the re-checked status filter, so each lapsed lease is requeued once.
--
-- Who is charged for a dead worker (issue #12). A job is charged a stall
-- (stalls + 1, failed as a job of death past max_stalls) only on evidence
-- that it caused the crash:
--   * it was the one suspect its worker ran isolated (isolated = true), or
--   * it was the worker's only active job.
-- A worker whose handlers ran in child processes (--pool process) is never
-- evidence against a job: a handler that crashes kills its child, which the
-- parent charges exactly (child_died); the parent's own death is from
-- outside ('parent': requeued, nothing charged; schema 0016).
-- Every other job of a worker that held an isolated suspect is a bystander:
-- requeued at once, nothing charged, but noted as present (suspect_stalls + 1,
-- as a witness): a poison job that is not a suspect yet cannot keep getting
-- the isolated suspect beside it charged, it is a suspect itself at its second
-- such crash (model/verdict.pml found it: a healthy suspect failed as a job of
-- death for a neighbour's crashes). A worker that died holding several jobs
-- and no isolated suspect died for a reason nobody can pin on one job (a
-- deploy, an OOM kill of the pod, a lost node): each of its jobs is a
-- witness, suspect_stalls + 1, and runs again at once, in parallel, wherever
-- there is capacity. A job that witnessed a second crash becomes a suspect;
-- workers run suspects one at a time, isolated, beside their other jobs, so
-- the next crash it causes points at it alone. A poison job among healthy
-- ones therefore costs them at most two shared re-runs and never a stall.
-- Limit: a frozen (SIGSTOPped) worker's leases lapse by their own deadlines;
-- jobs claimed at different times can lapse in different sweeps, and the
-- last one then looks alone and is charged. Harmless with max_stalls >= 1.
WITH lapsed AS (
    SELECT id, worker_id
    FROM jobq.job
    WHERE status = 'active' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), held AS (
    SELECT worker_id, count(*) AS n, count(*) FILTER (WHERE isolated) AS isolating
    FROM jobq.job
    WHERE status = 'active' AND worker_id IN (SELECT worker_id FROM lapsed)
    GROUP BY worker_id
), judged AS (
    SELECT l.id, coalesce(h.n, 1) AS held,
           CASE WHEN w.pool = 'process' THEN 'parent'  -- schema 0016: no evidence
                WHEN j.isolated THEN 'own'
                WHEN coalesce(h.isolating, 0) > 0 THEN 'bystander'
                WHEN coalesce(h.n, 1) <= 1 THEN 'own'
                ELSE 'witness' END AS verdict,
           w.vanished_at IS NOT NULL AS gone  -- its session ended: died or cut off
    FROM lapsed l
    JOIN jobq.job j ON j.id = l.id
    LEFT JOIN held h ON h.worker_id = l.worker_id
    LEFT JOIN jobq.worker w ON w.worker_id = l.worker_id
), requeued AS (
    UPDATE jobq.job j
    SET stalls = j.stalls + CASE WHEN d.verdict = 'own' THEN 1 ELSE 0 END,
        suspect_stalls = j.suspect_stalls
                         + CASE WHEN d.verdict IN ('witness', 'bystander') THEN 1 ELSE 0 END,
        suspect = j.suspect OR d.verdict = 'own'
                  OR (d.verdict IN ('witness', 'bystander') AND j.suspect_stalls + 1 >= 2),
        isolated = false,
        status = CASE WHEN d.verdict = 'own' AND j.stalls + 1 > q.max_stalls
                      THEN 'failed' ELSE 'queued' END,
        last_error = CASE WHEN d.verdict = 'own' AND j.stalls + 1 > q.max_stalls
            THEN format('job of death: its lease lapsed %s times (max_stalls=%s), '
                        'last held by worker %s', j.stalls + 1, q.max_stalls, j.worker_id)
            ELSE j.last_error END,
        finished_at = CASE WHEN d.verdict = 'own' AND j.stalls + 1 > q.max_stalls
                           THEN now() ELSE NULL END,
        lease_expires_at = NULL,
        run_at = now() + make_interval(secs => CASE WHEN d.verdict <> 'own' OR j.stalls = 0
            THEN 0 ELSE least(q.backoff_max_s, q.stall_cooldown_s * power(2, j.stalls - 1)) END),
        relay_after = now() + make_interval(secs => CASE WHEN d.verdict <> 'own' OR j.stalls = 0
            THEN 0 ELSE least(q.backoff_max_s, q.stall_cooldown_s * power(2, j.stalls - 1)) END),
        published_at = NULL
    FROM judged d, jobq.queue q
    WHERE j.id = d.id AND q.name = j.queue
    RETURNING j.id, j.queue, j.status, j.stalls, j.suspect_stalls, j.suspect, j.worker_id,
              j.attempts, j.last_error, d.verdict, d.held, d.gone, q.history
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, CASE WHEN status = 'failed' THEN 'failed' ELSE 'stalled' END, $2, attempts,
           CASE WHEN status = 'failed' THEN last_error
                WHEN verdict = 'own' THEN format('lease of worker %s lapsed (stall %s); '
                                                 'requeued', worker_id, stalls)
                WHEN verdict = 'bystander' THEN format('lease of worker %s lapsed while it '
                    'isolated another (suspect) job; requeued, not charged', worker_id)
                -- What happened to the worker first: a frozen one did not die,
                -- and its children did not either (the reason once said so).
                WHEN verdict = 'parent' THEN format('lease of worker %s lapsed: %s; its '
                    'handlers run in child processes (a crashing handler is charged when its '
                    'child dies), so this is no evidence against the job; requeued, not '
                    'charged', worker_id, CASE WHEN gone
                        THEN 'its database session ended (the worker died or was cut off)'
                        ELSE 'it stopped renewing while its session lived (frozen or '
                             'starved)' END)
                ELSE format('lease of worker %s lapsed while it held %s jobs; requeued, not '
                            'charged (crashes witnessed: %s%s)', worker_id, held,
                            suspect_stalls, CASE WHEN suspect THEN ', now a suspect: runs '
                                                 'isolated' ELSE '' END)
           END
    FROM requeued WHERE history
)
SELECT id, queue, status, stalls, suspect_stalls, verdict, worker_id FROM requeued;

-- name: isolate
-- grant: jobq_consumer
-- A worker starts a suspect's isolated run: from now until the run ends, if
-- the worker dies, this job alone is charged (requeue_lapsed). Fenced like
-- every worker write; zero rows means the lease is lost.
WITH marked AS (
    UPDATE jobq.job j
    SET isolated = true
    FROM jobq.queue q
    WHERE j.id = $1
      AND j.lock = $2
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
      AND q.name = j.queue
    RETURNING j.id, j.worker_id, j.attempts, j.stalls, j.suspect_stalls, q.history
), logged AS (  -- why it is a suspect, as requeue_lapsed and child_died decided it
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, 'isolated', worker_id, attempts,
           format('suspect (%s): runs isolated, one suspect per worker',
                  CASE WHEN suspect_stalls >= 2
                       THEN format('present at %s crashes of workers running it with others',
                                   suspect_stalls)
                       WHEN stalls >= 1
                       THEN format('%s crash(es) charged to it: a worker running it alone, '
                                   'or its child process, died', stalls)
                       ELSE 'its handler''s process died' END)
    FROM marked WHERE history
)
SELECT id FROM marked;

-- name: child_died
-- grant: jobq_consumer
-- --pool process: the child process running this job died (killed, OOM,
-- segfault, os._exit). The parent knows exactly which job it ran, so this is
-- the evidence requeue_lapsed can only guess at: the job is charged one
-- stall and put back in line at once (after the stall cool-down, as a lapse
-- would be), or failed as a job of death past max_stalls. No lease wait.
WITH died AS (
    UPDATE jobq.job j
    SET stalls = j.stalls + 1,
        suspect = true,
        isolated = false,
        status = CASE WHEN j.stalls + 1 > q.max_stalls THEN 'failed' ELSE 'queued' END,
        last_error = CASE WHEN j.stalls + 1 > q.max_stalls
            THEN format('job of death: its handler''s process died %s times (max_stalls=%s): %s',
                        j.stalls + 1, q.max_stalls, $3::text)
            ELSE $3::text END,
        finished_at = CASE WHEN j.stalls + 1 > q.max_stalls THEN now() ELSE NULL END,
        lease_expires_at = NULL,
        run_at = now() + make_interval(secs => CASE WHEN j.stalls = 0 THEN 0
            ELSE least(q.backoff_max_s, q.stall_cooldown_s * power(2, j.stalls - 1)) END),
        relay_after = now() + make_interval(secs => CASE WHEN j.stalls = 0 THEN 0
            ELSE least(q.backoff_max_s, q.stall_cooldown_s * power(2, j.stalls - 1)) END),
        published_at = NULL
    FROM jobq.queue q
    WHERE j.id = $1
      AND j.lock = $2
      AND j.status COLLATE "C" = 'active'
      AND j.lease_expires_at > now()
      AND q.name = j.queue
    RETURNING j.id, j.queue, j.lock, j.status, j.stalls, j.worker_id, j.attempts,
              j.last_error, j.run_at <= now() AS due, q.history
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, CASE WHEN status = 'failed' THEN 'failed' ELSE 'child_died' END, worker_id,
           attempts, last_error
    FROM died WHERE history
)
SELECT id, queue, lock, status, stalls, due FROM died;

-- name: quarantine
-- grant: jobq_consumer
-- A claim that fails on the job's own data (not on the database being
-- away), found by claiming the batch's ids one at a time: that job is
-- failed with the reason and never blocks the rest of intake again. The
-- caller does not say that it failed, nor why: jobq.claim_or_fail (schema
-- 0012) tries the claim itself and fails the job only if that claim raises a
-- data error (SQLSTATE class 22), with the server's own message. A claim that
-- works is rolled back and reported as such (false): the caller requeues.
SELECT jobq.claim_or_fail($1::uuid, $2::text, $3::text[], $4::uuid) AS failed;

-- name: lost_candidates
-- Queues holding due rows that were published a while ago and are still
-- waiting: the reaper then asks the broker (unpublish_lost) whether their
-- messages can still be there. PostgreSQL is the truth. A published row was
-- due when it was published (mark_published and the relay publish only due
-- rows; whatever sets run_at unpublishes), so published_at >= run_at, and
-- the run_at bound lets job_queued_idx skip a backlog's fresh rows: one
-- probe per queue, not a count of the backlog every few seconds. Written as
-- a LATERAL ... LIMIT 1 in run_at order, not EXISTS: with statistics that
-- have not caught up with a fast-growing backlog (no autovacuum yet), the
-- planner turned EXISTS into a hash of every waiting row (370 ms at 1 M
-- queued, bench/backlog.py); a lateral probe stays a nested loop.
SELECT q.name AS queue
FROM jobq.queue q
CROSS JOIN LATERAL (
    SELECT 1 FROM jobq.job j
    WHERE j.status = 'queued'
      AND j.queue = q.name
      AND j.run_at < now() - make_interval(secs => $1)
      AND j.published_at < now() - make_interval(secs => $1)
    ORDER BY j.run_at
    LIMIT 1) waiting;

-- name: local_statement_timeout
-- For the rest of the caller's transaction only ($1: milliseconds, as text).
SELECT set_config('statement_timeout', $1::text, true);

-- name: backlog
-- The reapers' backlog gauges (jobq_queue_depth{queue,state},
-- jobq_queue_oldest_wait_seconds): queued rows only (schema 0030), at most
-- once per backlog_every_s, under a statement timeout so a huge backlog
-- costs a missed sample, never a sweep.
SELECT queue, ready, delayed, waiting, parked, suspended, oldest_ready_s,
       suspended_sleep, suspended_signal, suspended_children, oldest_suspended_s
FROM jobq.backlog
ORDER BY queue;

-- name: lost_horizon
-- Before which moment a waiting row of queue $1 has lost its message
-- (unpublish_lost): $2 s before a horizon. With the broker queue empty ($3)
-- the horizon is now. With a backlog it is the newest publish among the
-- jobs consumers started in the last $2 s: a queue delivers in order, so a
-- message sent $2 s before one already started is behind it no more. (A
-- waiting row is kept only by an unacked delivery then: a busy or frozen
-- consumer's prefetch, a requeue; its republished id is a duplicate, which
-- consumers drop.) Without this a steady producer that outruns its consumers kept the
-- queue from ever emptying, and a lost job from ever running. NULL: nothing
-- started, nothing to tell. Both probes are partial-index scans of what
-- runs and what just finished, not of the table.
SELECT CASE WHEN $3::boolean THEN now() ELSE greatest(
    (SELECT max(published_at) FROM jobq.job
     WHERE queue = $1 AND status = 'active'
       AND started_at > now() - make_interval(secs => $2)),
    (SELECT max(published_at) FROM jobq.job
     WHERE finished_at > now() - make_interval(secs => $2)
       AND status IN ('completed', 'failed', 'cancelled')
       AND queue = $1 AND started_at > now() - make_interval(secs => $2)))
END - make_interval(secs => $2);

-- name: unpublish_lost
-- Hand the rows of queue $1 published before $2 (lost_horizon) and still
-- waiting back to the relay: their messages were lost (a purge, a classic
-- queue lost in a restart, ids dead-lettered). $2 is a parameter, not a
-- subquery, so the plan sees it: the run_at bound (implied, see
-- lost_candidates) keeps a backlog's fresh rows out of the index scan.
WITH target AS (
    SELECT id FROM jobq.job
    WHERE status = 'queued'
      AND queue = $1
      AND published_at < $2
      AND run_at < $2
    FOR UPDATE SKIP LOCKED
), lost AS (
    UPDATE jobq.job j
    SET published_at = NULL, relay_after = now(), lock = gen_random_uuid()  -- (hand_back)
    FROM target, jobq.queue q
    WHERE j.id = target.id AND q.name = j.queue
    RETURNING j.id, q.history
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, detail)
    SELECT id, 'republished', CASE WHEN $3::boolean
        THEN 'message lost by the broker (its queue was empty)'
        ELSE 'message lost by the broker (jobs published after it have started)' END
    FROM lost WHERE history
)
SELECT count(*) FROM lost;

-- name: unpark
-- Reapers, every sweep: jobs a limit or a pause held back at claim time go
-- back to the relay, as many as the limits would let start now: per queue,
-- its free max_running slots and rate tokens (none while paused; all once
-- the queue has no limit); in a queue with per-key limits, per key, its
-- free per-key slots and tokens, best first (priority, then age). Jobs
-- already back in line and not started yet count against the room (issue
-- #47: each sweep released another cap's worth while the last one still
-- waited in the broker, so a burst was not held back). Keys with parked
-- jobs are found by a loose index scan (one probe per key, not a read of
-- the backlog). The claim still decides; this only meters what is
-- published, so a key's backlog never circles through the broker.
WITH RECURSIVE lim AS (
    SELECT q.name, q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL
                   OR q.key_policy = 'fifo' AS per_key, q.priority_aging_s AS aging_s,
           greatest(0, jobq.allowance(q, (SELECT count(*) FROM jobq.job a  -- 0010, 0013
                                          WHERE a.queue = q.name AND a.status = 'active'))
                       - (SELECT count(*) FROM (
                              SELECT 1 FROM jobq.job w  -- back in line, not started
                              WHERE w.queue = q.name AND w.status = 'queued'
                                AND w.relay_after < 'infinity' AND w.waiting_on = 0
                                AND w.run_at <= now()
                                AND (q.max_running_per_key IS NULL
                                     AND q.rate_per_s_per_key IS NULL
                                     AND q.key_policy <> 'fifo' OR w.key IS NULL)
                              LIMIT coalesce(q.max_running, 10000)) x)) AS n
    FROM jobq.queue q  -- (no limit: 2147483647)
    WHERE EXISTS (SELECT 1 FROM jobq.job p
                  WHERE p.queue = q.name AND p.status = 'queued' AND p.published_at IS NULL
                    AND p.relay_after = 'infinity' AND p.waiting_on = 0)
), parked_keys AS (
    SELECT f.queue, f.key
    FROM lim CROSS JOIN LATERAL (
        SELECT p.queue, p.key FROM jobq.job p
        WHERE p.queue = lim.name AND p.status = 'queued' AND p.relay_after = 'infinity' AND p.waiting_on = 0
          AND p.key IS NOT NULL
        ORDER BY p.key LIMIT 1) f
    WHERE lim.per_key AND lim.n > 0
    UNION ALL
    SELECT nx.queue, nx.key
    FROM parked_keys pk CROSS JOIN LATERAL (
        SELECT p.queue, p.key FROM jobq.job p
        WHERE p.queue = pk.queue AND p.status = 'queued' AND p.relay_after = 'infinity' AND p.waiting_on = 0
          AND p.key > pk.key
        ORDER BY p.key LIMIT 1) nx
), key_room AS (  -- a fifo key: one at a time, its head (schema 0027)
    SELECT pk.queue, pk.key, q.key_policy = 'fifo' AS fifo, q.halt_on_failure AS halt,
           least(l.n, CASE WHEN q.key_policy = 'fifo' AND EXISTS (
                               SELECT 1 FROM jobq.job o
                               WHERE o.queue = pk.queue AND o.key = pk.key
                                 AND (o.status = 'active' OR o.status = 'queued'
                                      AND o.relay_after < 'infinity'))
                           THEN 0 ELSE 2147483647 END, greatest(0,
               jobq.key_allowance(t, (SELECT count(*) FROM jobq.job a
                                      WHERE a.queue = pk.queue AND a.key = pk.key
                                        AND a.status = 'active'),
                                  jobq.key_tokens(t, r.tokens, r.at))
               - (SELECT count(*) FROM (
                      SELECT 1 FROM jobq.job w  -- back in line, not started
                      WHERE w.queue = pk.queue AND w.key = pk.key AND w.status = 'queued'
                        AND w.relay_after < 'infinity' AND w.waiting_on = 0
                      LIMIT coalesce(t.max_running_per_key, 10000)) x))) AS n
    FROM parked_keys pk
    JOIN lim l ON l.name = pk.queue
    JOIN jobq.queue q ON q.name = pk.queue
    CROSS JOIN LATERAL jobq.key_tier(q, pk.key) t  -- the key's tier (schema 0036)
    LEFT JOIN jobq.key_rate r ON r.queue = pk.queue AND r.key = pk.key
), picked AS (
    SELECT p.id
    FROM key_room kr CROSS JOIN LATERAL (
        SELECT j.id FROM jobq.job j
        WHERE j.queue = kr.queue AND j.key = kr.key AND j.status = 'queued'
          AND j.published_at IS NULL AND j.relay_after = 'infinity' AND j.waiting_on = 0
          AND NOT kr.fifo
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT kr.n
        FOR UPDATE SKIP LOCKED) p
    UNION ALL
    SELECT p.id  -- a fifo key: its head, if parked. Found by job_key_open_seq_idx
    FROM key_room kr CROSS JOIN LATERAL (  -- (0041): its ended jobs are never read
        SELECT j.id FROM jobq.job j
        WHERE j.id = (SELECT h.id FROM jobq.job h  -- a failed head halts it (0041)
                      WHERE h.queue = kr.queue AND h.key = kr.key AND h.seq IS NOT NULL
                        AND h.status IN ('queued', 'active', 'failed')
                        AND (h.status <> 'failed' OR kr.halt)
                      ORDER BY h.seq LIMIT 1)
          AND kr.fifo AND kr.n > 0 AND j.status = 'queued' AND j.published_at IS NULL
          AND j.relay_after = 'infinity' AND j.waiting_on = 0
        FOR UPDATE SKIP LOCKED) p
    UNION ALL
    SELECT p.id
    FROM lim CROSS JOIN LATERAL (
        SELECT j.id FROM jobq.job j
        WHERE j.queue = lim.name AND j.status = 'queued' AND j.published_at IS NULL
          AND j.relay_after = 'infinity' AND j.waiting_on = 0 AND (NOT lim.per_key OR j.key IS NULL)
          AND lim.aging_s IS NULL
        ORDER BY j.priority DESC, j.run_at, j.id  -- best first (issue #51: priority 9 went last)
        LIMIT lim.n
        FOR UPDATE SKIP LOCKED) p
    UNION ALL  -- priority aging (schema 0040): best level now first. Within a priority
    SELECT p.id  -- the oldest is the highest, so the best n are among each one's n oldest
    FROM lim CROSS JOIN LATERAL (
        SELECT j.id FROM jobq.job j
        WHERE j.id = ANY(ARRAY(
                  SELECT h.id FROM generate_series(0, 9) AS lv(p) CROSS JOIN LATERAL (
                      SELECT o.id FROM jobq.job o  -- job_parked_best_idx, one level
                      WHERE o.queue = lim.name AND o.status = 'queued'
                        AND o.relay_after = 'infinity' AND o.waiting_on = 0
                        AND o.priority = lv.p AND o.published_at IS NULL
                        AND (NOT lim.per_key OR o.key IS NULL)
                      ORDER BY o.run_at, o.id LIMIT lim.n) h))
          AND j.status = 'queued' AND j.published_at IS NULL AND j.relay_after = 'infinity'
          AND j.waiting_on = 0
        ORDER BY jobq.aged(j.priority, j.run_at, lim.aging_s) DESC, j.run_at, j.id
        LIMIT lim.n
        FOR UPDATE SKIP LOCKED) p
    WHERE lim.aging_s IS NOT NULL
)
UPDATE jobq.job j SET relay_after = now()
FROM picked WHERE j.id = picked.id;

-- name: unpark_freed
-- grant: jobq_consumer
-- A consumer that just finished a job of a limited queue frees a slot: it
-- releases one parked job and publishes it at once (the claim still
-- decides; the reapers' unpark is the fallback). In a queue with per-key
-- limits the slot is its key's: the best parked job of the same key;
-- otherwise the queue's best parked job (priority, then age). Nothing
-- while the queue is paused. Fenced by the finished job: $1 and its token
-- $2 prove the caller ran a job of that queue, which is no longer active;
-- the proof is spent here (slot_freed, schema 0024), so it frees one slot,
-- once (issue #47: one proof unparked job after job). The finished row
-- keeps its token (a retried write, and the checkers, recognise its run).
-- The unparked spell's token is made here, not by the caller: $3 (the
-- token the release before chose) is taken and ignored, so a consumer of
-- that release keeps working through a rolling upgrade.
WITH proof AS (
    SELECT j.id, j.queue, j.key, coalesce(j.key_policy = 'fifo', false) AS fifo,
           q.priority_aging_s AS aging_s, q.halt_on_failure AS halt,
           q.max_running_per_key IS NOT NULL OR q.rate_per_s_per_key IS NOT NULL
               OR j.key_policy = 'fifo' AS per_key
    FROM jobq.job j JOIN jobq.queue q ON q.name = j.queue
    WHERE j.id = $1 AND j.lock = $2 AND j.status COLLATE "C" <> 'active' AND NOT q.paused
      AND NOT j.slot_freed AND ($3::uuid IS NULL OR $3::uuid IS NOT NULL)
    FOR NO KEY UPDATE OF j
), spent AS (
    UPDATE jobq.job j SET slot_freed = true
    FROM proof WHERE j.id = proof.id
), picked AS (
    SELECT coalesce(
        (SELECT x.id FROM jobq.job x  -- a fifo key: its head, if parked; its ended
         WHERE x.id = (SELECT h.id FROM jobq.job h  -- jobs are never read (0041); a
                       WHERE h.queue = proof.queue AND h.key = proof.key  -- failed head
                         AND h.seq IS NOT NULL AND h.status IN ('queued', 'active', 'failed')
                         AND (h.status <> 'failed' OR proof.halt)  -- halts a halting key
                       ORDER BY h.seq LIMIT 1)
           AND proof.fifo AND proof.key IS NOT NULL AND x.status = 'queued'
           AND x.relay_after = 'infinity' AND x.waiting_on = 0 AND x.published_at IS NULL
         FOR UPDATE OF x SKIP LOCKED),
        (SELECT x.id FROM jobq.job x
         WHERE proof.per_key AND proof.key IS NOT NULL AND NOT proof.fifo
           AND x.queue = proof.queue AND x.key = proof.key AND x.status = 'queued'
           AND x.relay_after = 'infinity' AND x.waiting_on = 0 AND x.published_at IS NULL
         ORDER BY x.priority DESC, x.run_at, x.id
         LIMIT 1
         FOR UPDATE OF x SKIP LOCKED),
        (SELECT x.id FROM jobq.job x
         WHERE NOT (proof.per_key AND proof.key IS NOT NULL) AND proof.aging_s IS NULL
           AND x.queue = proof.queue AND x.status = 'queued'
           AND x.relay_after = 'infinity' AND x.waiting_on = 0 AND x.published_at IS NULL
         ORDER BY x.priority DESC, x.run_at, x.id
         LIMIT 1
         FOR UPDATE OF x SKIP LOCKED),
        (SELECT x.id FROM jobq.job x  -- priority aging (0040): the best level of the heads
         WHERE x.id = ANY(ARRAY(     -- of each priority (its oldest parked job)
                   SELECT h.id FROM generate_series(0, 9) AS lv(p) CROSS JOIN LATERAL (
                       SELECT o.id FROM jobq.job o
                       WHERE o.queue = proof.queue AND o.status = 'queued'
                         AND o.relay_after = 'infinity' AND o.waiting_on = 0
                         AND o.priority = lv.p AND o.published_at IS NULL
                       ORDER BY o.run_at, o.id LIMIT 1) h))
           AND NOT (proof.per_key AND proof.key IS NOT NULL) AND proof.aging_s IS NOT NULL
           AND x.status = 'queued' AND x.relay_after = 'infinity' AND x.waiting_on = 0
           AND x.published_at IS NULL
         ORDER BY jobq.aged(x.priority, x.run_at, proof.aging_s) DESC, x.run_at, x.id
         LIMIT 1
         FOR UPDATE OF x SKIP LOCKED)) AS id
    FROM proof
)
UPDATE jobq.job j SET relay_after = now(), lock = gen_random_uuid()
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.queue, j.lock;

-- name: wake_signalled
-- Reapers (duty "wake", issue #52): signals not yet seen, oldest first, at
-- most $1: a job suspended waiting for one is made due now (the relay
-- publishes it in this sweep) and the signal marked delivered; one for a
-- job that ended is marked too; one for a job still running stays (its
-- wait_for reads it, or its suspend sees it, or a later sweep wakes it).
-- The job's row is locked by the UPDATE only if it still waits for that
-- signal under the lock: a suspend committing meanwhile is waited for,
-- then seen. Returns how many jobs were woken.
WITH pending AS (
    SELECT s.job_id, s.name
    FROM jobq.job_signal s
    WHERE NOT s.delivered
    ORDER BY s.sent_at
    LIMIT $1
    FOR UPDATE OF s SKIP LOCKED
), woken AS (
    UPDATE jobq.job j
    SET run_at = now(), relay_after = now(), wake_on = NULL
    FROM pending p
    WHERE j.id = p.job_id AND j.status = 'queued' AND j.wake_on = p.name
    RETURNING j.id, j.queue, p.name
), seen AS (
    UPDATE jobq.job_signal s
    SET delivered = true
    FROM pending p
    LEFT JOIN jobq.job j ON j.id = p.job_id
    WHERE s.job_id = p.job_id AND s.name = p.name
      AND (p.job_id IN (SELECT id FROM woken)
           OR j.id IS NULL OR j.status NOT IN ('queued', 'active'))
), joined AS (  -- job.join (schema 0029): none of its children queued or running
    UPDATE jobq.job j
    SET run_at = now(), relay_after = now(), joining = NULL
    WHERE j.id IN (SELECT p.id FROM jobq.job p
                   WHERE p.joining IS NOT NULL AND p.status = 'queued'
                     AND NOT EXISTS (SELECT 1 FROM jobq.job c
                                     WHERE c.id = ANY(p.joining)
                                       AND c.status IN ('queued', 'active'))
                   ORDER BY p.id  -- job_joining_idx's order (its predicate's rows)
                   LIMIT $1)
      AND j.joining IS NOT NULL AND j.status = 'queued'
    RETURNING j.id, j.queue, 'children ended'::text AS name
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, detail)
    SELECT w.id, 'woken', format('signal %s', w.name)
    FROM woken w JOIN jobq.queue q ON q.name = w.queue
    WHERE q.history
    UNION ALL
    SELECT w.id, 'woken', w.name
    FROM joined w JOIN jobq.queue q ON q.name = w.queue
    WHERE q.history
)
SELECT (SELECT count(*) FROM woken) + (SELECT count(*) FROM joined);

-- name: settle_dependants
-- Reapers, each sweep with anything to settle (sweep_probe's dependants):
-- arm the new edges of jobs published `after` others, release or cancel the
-- dependants of jobs that ended, at most $1 edges and $2 rounds (one level
-- of a chain a round), one reaper at a time (jobq.settle_dependants,
-- schema 0024). more: it stopped at a bound with work left.
SELECT released, cancelled, more FROM jobq.settle_dependants($1, $2);

-- name: schedules_due
-- Reapers: schedules whose slot has come, with the database clock's now.
SELECT name, queue, cron, interval_s, timezone, enabled, next_run_at, created_at,
       now() AS now
FROM jobq.schedule
WHERE enabled AND next_run_at <= now()
ORDER BY next_run_at
LIMIT $1;

-- name: schedule_lock
-- The schedule's row lock, first and alone, in the transaction of a fire, a
-- trigger or a backfill: the statement after it takes a new snapshot, so it
-- sees a job the last holder of the lock put in line (overlap skip, and a
-- backfill's missing slots, are read after the lock, not before it).
SELECT name FROM jobq.schedule WHERE name = $1 FOR UPDATE;

-- name: schedule_try_lock
-- The reapers' schedule_lock: a schedule another session holds (a reaper
-- firing it, an operator's trigger) is not waited for; no row back.
SELECT name FROM jobq.schedule WHERE name = $1 FOR UPDATE SKIP LOCKED;

-- name: schedule_fire
-- One slot of one schedule, once: only if next_run_at is still the slot
-- this reaper read ($2); the row lock (schedule_lock, just before, in the
-- same transaction) makes a racing reaper wait, then find it advanced. The
-- job's idempotency key names the slot. $3: the next slot. Under overlap
-- skip a slot whose schedule still has a live job enqueues nothing and is
-- kept in skipped_slots (the latest 100).
WITH due AS (
    SELECT s.name, s.queue, s.payload,
           s.overlap = 'skip' AND EXISTS (
               SELECT 1 FROM jobq.job j
               WHERE j.id = s.last_job_id AND j.status IN ('queued', 'active')) AS busy
    FROM jobq.schedule s
    WHERE s.name = $1 AND s.next_run_at = $2 AND s.enabled
), job AS (
    SELECT jobq.enqueue(d.queue, d.payload, 0,
               format('schedule:%s:%s', d.name,
                      to_char($2::timestamptz AT TIME ZONE 'UTC',
                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')), 0) AS id
    FROM due d WHERE NOT d.busy
), advanced AS (
    UPDATE jobq.schedule s
    SET next_run_at = $3, last_slot = $2,
        last_job_id = CASE WHEN due.busy THEN s.last_job_id ELSE (SELECT id FROM job) END,
        skipped_total = s.skipped_total + due.busy::int,
        skipped_slots = CASE WHEN NOT due.busy THEN s.skipped_slots
                             ELSE (s.skipped_slots || $2::timestamptz)[
                                      greatest(1, cardinality(s.skipped_slots) - 98):] END
    FROM due WHERE s.name = due.name
)
SELECT (SELECT id FROM job) AS id, coalesce((SELECT busy FROM due), false) AS skipped;

-- name: schedule_trigger
-- `jobq schedule trigger NAME`: one job of the schedule now, outside its
-- slots (next_run_at unchanged), under its row lock (schedule_lock first).
-- Under overlap skip, a live job of the schedule is returned instead
-- (live = true) and nothing is enqueued. NULL: no schedule of that name.
WITH s AS (
    SELECT s.name, s.queue, s.payload,
           (SELECT j.id FROM jobq.job j
            WHERE s.overlap = 'skip' AND j.id = s.last_job_id
              AND j.status IN ('queued', 'active')) AS live_id
    FROM jobq.schedule s WHERE s.name = $1
), job AS (
    SELECT jobq.enqueue(s.queue, s.payload, 0,
               format('schedule:%s:trigger:%s', s.name,
                      to_char(clock_timestamp() AT TIME ZONE 'UTC',
                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')), 0) AS id
    FROM s WHERE s.live_id IS NULL
), noted AS (
    UPDATE jobq.schedule t SET last_job_id = (SELECT id FROM job)
    FROM job WHERE t.name = $1
)
SELECT coalesce((SELECT id FROM job), s.live_id) AS id, s.live_id IS NOT NULL AS live
FROM s;

-- name: schedule_backfill
-- `jobq schedule backfill NAME --from --to`: a job for each slot of $2 (the
-- schedule's slots in the range, computed by the caller) that has no job
-- row yet (its key schedule:<name>:<slot>, whoever fired it), under the row
-- lock (schedule_lock first), so running it twice, or beside a reaper
-- firing, makes each missing slot's job exactly once. Overlap is not
-- applied: a backfill asks for these slots. The slots enqueued, with ids.
WITH s AS (
    SELECT name, queue, payload FROM jobq.schedule WHERE name = $1
), slots AS (
    SELECT slot, format('schedule:%s:%s', s.name,
                        to_char(slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) AS key
    FROM s, unnest($2::timestamptz[]) AS slot
), missing AS (
    SELECT slots.slot, slots.key FROM slots, s
    WHERE NOT EXISTS (SELECT 1 FROM jobq.job j
                      WHERE j.queue = s.queue AND j.idempotency_key = slots.key)
)
SELECT m.slot, jobq.enqueue(s.queue, s.payload, 0, m.key, 0) AS id
FROM missing m, s
ORDER BY m.slot;

-- name: schedule_get
-- One schedule (the backfill computes its slots from it).
SELECT name, queue, cron, interval_s, timezone, enabled, next_run_at, created_at, overlap,
       now() AS now
FROM jobq.schedule WHERE name = $1;

-- name: schedule_overlap
-- grant: jobq_consumer
-- The overlap an app declares for its schedule (@app.periodic(overlap=...)),
-- after schedule_upsert stored it: only the app's own schedule (an operator's
-- word wins, another login's schedule is not this one's).
UPDATE jobq.schedule SET overlap = $2
WHERE name = $1 AND source = 'app' AND owner = session_user::text AND overlap <> $2
RETURNING name;

-- name: schedule_set
-- `jobq schedule set` (an operator verb, run as the schema owner). A
-- schedule whose timing is unchanged keeps its next slot; a changed one
-- starts anew. The operator's word wins over an app's declaration, and a
-- schedule set here is the operator's from now on (source). $9: the
-- overlap policy, or NULL to keep the stored one ('allow' for a new one).
WITH stored AS (
    INSERT INTO jobq.schedule AS s (name, queue, payload, cron, timezone, interval_s, next_run_at,
                                    enabled, source, overlap)
    VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7, $8, 'operator', coalesce($9, 'allow'))
    ON CONFLICT (name) DO UPDATE
    SET queue = excluded.queue, payload = excluded.payload, cron = excluded.cron,
        timezone = excluded.timezone, interval_s = excluded.interval_s, enabled = excluded.enabled,
        source = 'operator', last_error = NULL, overlap = coalesce($9, s.overlap),
        next_run_at = CASE WHEN (s.cron, s.timezone, s.interval_s)
                                IS NOT DISTINCT FROM (excluded.cron, excluded.timezone,
                                                      excluded.interval_s)
                           THEN s.next_run_at ELSE excluded.next_run_at END
    RETURNING name
)
-- A new slot may come before an idle reaper's next probe: wake it (reaper/wakes.py).
SELECT stored.name FROM stored CROSS JOIN LATERAL (SELECT pg_notify('jobq_delayed', '')) AS woke;

-- name: schedule_upsert
-- grant: jobq_consumer
-- Consumers store the schedules their app declares (@app.periodic), the
-- narrow path (the name and arguments it always had, so consumers of the
-- release before keep working through an upgrade; its reach is new): a schedule enqueues jobs, so the caller's login must also be
-- a producer (jobq_producer); it never touches a schedule an operator set
-- (source 'operator'); it keeps an unchanged schedule's next slot. No row
-- back: not stored (the consumer logs why, once).
WITH stored AS (
    INSERT INTO jobq.schedule AS s (name, queue, payload, cron, timezone, interval_s, next_run_at,
                                    enabled, source, owner)
    SELECT $1, $2, $3::jsonb, $4, $5, $6, $7, $8, 'app', session_user
    WHERE pg_has_role(session_user, 'jobq_producer', 'MEMBER')
    ON CONFLICT (name) DO UPDATE
    SET queue = excluded.queue, payload = excluded.payload, cron = excluded.cron,
        timezone = excluded.timezone, interval_s = excluded.interval_s, enabled = excluded.enabled,
        last_error = NULL, owner = session_user,
        next_run_at = CASE WHEN (s.cron, s.timezone, s.interval_s)
                                IS NOT DISTINCT FROM (excluded.cron, excluded.timezone,
                                                      excluded.interval_s)
                           THEN s.next_run_at ELSE excluded.next_run_at END
    -- an app's schedule is its login's (schema 0024): another app login
    -- cannot rewrite it; one stored before owners were kept is taken once
    WHERE s.source = 'app' AND (s.owner IS NULL OR s.owner = session_user::text)
    RETURNING name
)
-- A new slot may come before an idle reaper's next probe: wake it (reaper/wakes.py).
SELECT stored.name FROM stored CROSS JOIN LATERAL (SELECT pg_notify('jobq_delayed', '')) AS woke;

-- name: schedule_skip
-- A slot that could not be fired (its payload is over the queue's limit, the
-- queue cannot take it, its cron no longer parses): recorded on the
-- schedule and stepped over, so it never stays first in line and blocks
-- the others. $3: the next slot, or NULL to disable the schedule (nothing
-- left to compute a slot from).
UPDATE jobq.schedule
SET last_error = $4, last_error_at = now(), last_slot = $2,
    next_run_at = coalesce($3, next_run_at), enabled = enabled AND $3 IS NOT NULL
WHERE name = $1 AND next_run_at = $2;

-- name: db_now
-- The database clock (the only clock for slots and deadlines).
SELECT now();

-- name: schedule_list
SELECT name, queue, payload, cron, timezone, interval_s, enabled, next_run_at, last_slot,
       last_job_id, source, last_error, overlap, skipped_total,
       skipped_slots[cardinality(skipped_slots)] AS last_skipped
FROM jobq.schedule
ORDER BY name;

-- name: schedule_delete
DELETE FROM jobq.schedule WHERE name = $1 RETURNING name;

-- name: expire_due
-- Deadlines (schema 0031): up to $1 unstarted queued jobs past their
-- expires_at cancelled with reason "expired", in id order like every
-- multi-row write; a row another transaction holds is skipped (SKIP LOCKED:
-- the reaper never waits on a producer's or operator's lock, I11) and taken
-- by the next sweep. Dependants are cancelled by the dependants duty after
-- it, with the reason. How many.
WITH doomed AS (
    SELECT id FROM jobq.job
    WHERE status = 'queued' AND expires_at IS NOT NULL AND started_at IS NULL
      AND expires_at <= now()
    ORDER BY id
    LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
), expired AS (
    UPDATE jobq.job j
    SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL,
        last_error = format('expired: not started by its deadline %s', j.expires_at)
    FROM doomed d, jobq.queue q
    WHERE j.id = d.id AND q.name = j.queue
      AND j.status = 'queued' AND j.started_at IS NULL AND j.expires_at <= now()
    RETURNING j.id, j.attempts, j.last_error, q.history
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, attempt, detail)
    SELECT id, 'cancelled', attempts, last_error FROM expired WHERE history
)
SELECT count(*) FROM expired;

-- name: supersede_pending
-- Key policy latest (schema 0042): the keys of up to $1 notes of new jobs
-- (one a job, schema 0045); per key, its queued jobs older than its newest
-- are cancelled as superseded, as the claim would when one came to start (a
-- delayed or parked one waited till then). A note is taken only if this
-- statement's snapshot sees it, and so sees its job: one committed after
-- the statement began is left for the next sweep. In id order like every
-- multi-row write; a row another transaction holds is skipped (SKIP LOCKED,
-- I11): a claim holding it cancels it itself. A running one is its worker's
-- renewal's to stop. How many were cancelled, and whether it took its limit
-- of notes (then more may wait: the reaper sweeps again at once).
WITH taken AS (
    DELETE FROM jobq.latest_key k
    WHERE k.n = ANY(ARRAY(SELECT l.n FROM jobq.latest_key l
                          ORDER BY l.n LIMIT $1 FOR UPDATE SKIP LOCKED))
    RETURNING k.queue, k.key
), keys AS (
    SELECT DISTINCT t.queue, t.key FROM taken t
), newest AS (
    SELECT k.queue, k.key, n.id, n.seq
    FROM keys k CROSS JOIN LATERAL (
        SELECT j.id, j.seq FROM jobq.job j  -- job_key_seq_idx, newest first
        WHERE j.queue = k.queue AND j.key = k.key AND j.seq IS NOT NULL
        ORDER BY j.seq DESC LIMIT 1) n
), doomed AS (
    SELECT o.id, nw.id AS newer
    FROM newest nw JOIN jobq.job o  -- a partial index of queued rows: never its ended ones
      ON o.queue = nw.queue AND o.key = nw.key AND o.seq < nw.seq
    WHERE o.status = 'queued' AND o.key_policy = 'latest'
    ORDER BY o.id
    FOR NO KEY UPDATE OF o SKIP LOCKED
), superseded AS (
    UPDATE jobq.job j
    SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL,
        last_error = format('superseded by job %s (key policy latest)', d.newer)
    FROM doomed d, jobq.queue q
    WHERE j.id = d.id AND q.name = j.queue AND j.status = 'queued'
    RETURNING j.id, j.attempts, j.last_error, q.history
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, attempt, detail)
    SELECT id, 'superseded', attempts, last_error FROM superseded WHERE history
)
SELECT (SELECT count(*) FROM superseded) AS cancelled,
       (SELECT count(*) FROM taken) >= $1 AS more;

-- name: sweep_probe
-- Reaper, before each sweep (issue #37): which duties have anything to do,
-- and the seconds until the earliest lease deadline, relay time or schedule
-- slot or job deadline (NULL: none pending). Index probes only, one statement: what an idle
-- fleet costs the database. Each flag is the condition of its duty's own
-- statement (workers_vanished and requeue_lapsed, unpark, relay_take,
-- schedules_due), so a duty skipped had nothing to do when this ran; what
-- turns up after it waits for the next loop, at most max_sleep_s (idle, at
-- most idle_sleep_s and min_lease_s: reaper/wakes.py). 10,000 jobs asleep
-- (job.sleep) or delayed cost it two index entries, not a read of each
-- (bench/suspension_cost.py): the earliest relay time is the index's first
-- entry and the joining flag an ordered probe of its partial index.
SELECT EXISTS (SELECT 1 FROM jobq.job WHERE status = 'active') AS active,
       EXISTS (SELECT 1 FROM jobq.worker w
               WHERE w.vanished_at IS NULL
                 AND NOT EXISTS (
                     SELECT 1 FROM pg_locks l
                     WHERE l.locktype = 'advisory'
                       AND l.database = (SELECT oid FROM pg_database
                                         WHERE datname = current_database())
                       AND l.classid = (w.lock_key >> 32)::bigint::oid
                       AND l.objid = (w.lock_key & 4294967295)::bigint::oid
                       AND l.objsubid = 1
                       AND l.granted)) AS vanished,
       EXISTS (SELECT 1 FROM jobq.job
               WHERE status = 'queued' AND published_at IS NULL
                 AND relay_after = 'infinity') AS parked,
       EXISTS (SELECT 1 FROM jobq.job
               WHERE status = 'queued' AND published_at IS NULL
                 AND relay_after <= now()) AS relay_due,
       EXISTS (SELECT 1 FROM jobq.schedule
               WHERE enabled AND next_run_at <= now()) AS schedules_due,
       EXISTS (SELECT 1 FROM jobq.job_signal WHERE NOT delivered)
           OR (SELECT id FROM jobq.job  -- job_joining_idx, in its order: no table scan
               WHERE joining IS NOT NULL AND status = 'queued'  -- (a cancelled join: no)
               ORDER BY id LIMIT 1) IS NOT NULL AS signals,
       EXISTS (SELECT 1 FROM jobq.job_dependency WHERE state = 'new')
           OR EXISTS (SELECT 1 FROM jobq.job
                      WHERE has_dependants
                        AND status IN ('completed', 'failed', 'cancelled')) AS dependants,
       EXISTS (SELECT 1 FROM jobq.latest_key) AS superseding,  -- schema 0042
       EXISTS (SELECT 1 FROM jobq.job  -- job_expiring_idx (schema 0031)
               WHERE status = 'queued' AND expires_at IS NOT NULL AND started_at IS NULL
                 AND expires_at <= now()) AS expiring,
       extract(epoch FROM least(
           (SELECT min(lease_expires_at) FROM jobq.job WHERE status = 'active'),
           (SELECT relay_after FROM jobq.job  -- job_unpublished_idx's first, not a
             WHERE status = 'queued' AND published_at IS NULL  -- min() over all of it
               AND relay_after < 'infinity'  -- parked by a limit: unpark decides
             ORDER BY relay_after LIMIT 1),
           (SELECT min(next_run_at) FROM jobq.schedule WHERE enabled),
           (SELECT min(expires_at) FROM jobq.job
             WHERE status = 'queued' AND expires_at IS NOT NULL AND started_at IS NULL)
       ) - now())::float8 AS seconds,
       (SELECT min(lease_s) FROM jobq.queue)::float8 AS min_lease_s;

-- name: audit_claims
-- grant: jobq_reaper
-- The invariant monitor (schema 0035, reaper/audit.py), I2. Each 'claimed'
-- event after event $1 (at most $2, oldest first, a second old at least so
-- that a slower transaction's event is not passed over) whose job's latest
-- claim or run end before it is another worker's claim: two workers held
-- live leases at once. (A run ends by the events that end its lease: not
-- worker_vanished, which only shortens it, nor isolated, which marks a
-- suspect's run.) A claim visible here was allowed by the end before
-- it (the row lock orders them), so that end is visible too. Recorded once
-- per job. The last event read and how many violations are new.
WITH ev AS (
    SELECT e.n, e.job_id, e.worker_id, e.at
    FROM jobq.job_event e
    WHERE e.n > $1 AND e.event = 'claimed' AND e.at < now() - interval '1 second'
    ORDER BY e.n
    LIMIT $2
), doubled AS (
    SELECT ev.n, ev.job_id, ev.worker_id, ev.at, p.n AS prev_n, p.worker_id AS prev_worker,
           p.at AS prev_at
    FROM ev CROSS JOIN LATERAL (
        SELECT p.n, p.event, p.worker_id, p.at FROM jobq.job_event p
        WHERE p.job_id = ev.job_id AND p.n < ev.n
          AND p.event IN ('claimed', 'retry', 'failed', 'released', 'stalled', 'cancelled',
                            'child_died', 'snoozed', 'rate_limited', 'superseded',
                            'suspended', 'completed')
        ORDER BY p.n DESC
        LIMIT 1) p
    WHERE p.event = 'claimed' AND p.worker_id IS DISTINCT FROM ev.worker_id
), found AS (
    INSERT INTO jobq.invariant_violation (kind, job_id, queue, event_n, detail)
    SELECT 'two_live_leases', d.job_id, j.queue, d.n,
           format('claimed by %s at %s while the claim of %s at %s (event %s) had not ended',
                  d.worker_id, d.at, d.prev_worker, d.prev_at, d.prev_n)
    FROM doubled d JOIN jobq.job j ON j.id = d.job_id
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT coalesce((SELECT max(n) FROM ev), $1) AS last_n, (SELECT count(*) FROM found)::int AS found;

-- name: audit_completions
-- grant: jobq_reaper
-- The invariant monitor: completed jobs after ($1 finished_at, $2 id), at
-- most $3, a second old at least, of queues that keep history: the
-- completion must be by the worker of the job's latest claim before it, with
-- no end of that run between the claim and the completion (a completion
-- accepted without a live lease). Recorded once per job. Where it read to
-- and how many violations are new.
WITH done AS (
    SELECT j.id, j.queue, j.worker_id, j.finished_at
    FROM jobq.job j
    WHERE j.status = 'completed' AND (j.finished_at, j.id) > ($1, $2)
      AND j.finished_at < now() - interval '1 second'
    ORDER BY j.finished_at, j.id
    LIMIT $3
), judged AS (
    SELECT d.id, d.queue, d.worker_id, d.finished_at, c.n AS claim_n,
           c.worker_id AS claim_worker,
           (SELECT x.event FROM jobq.job_event x
            WHERE x.job_id = d.id AND x.n > c.n AND x.at <= d.finished_at
              AND x.event IN ('retry', 'failed', 'released', 'stalled', 'cancelled',
                            'child_died', 'snoozed', 'rate_limited', 'superseded',
                            'suspended', 'completed')
            ORDER BY x.n LIMIT 1) AS ended_by
    FROM done d CROSS JOIN LATERAL (
        SELECT c.n, c.worker_id FROM jobq.job_event c
        WHERE c.job_id = d.id AND c.event = 'claimed' AND c.at <= d.finished_at
        ORDER BY c.n DESC
        LIMIT 1) c
), found AS (
    INSERT INTO jobq.invariant_violation (kind, job_id, queue, event_n, detail)
    SELECT 'completed_without_lease', id, queue, claim_n,
           CASE WHEN claim_worker IS DISTINCT FROM worker_id
                THEN format('completed by %s at %s; the latest claim before it was %s''s '
                            '(event %s)', worker_id, finished_at, claim_worker, claim_n)
                ELSE format('completed by %s at %s after its claim (event %s) ended: %s',
                            worker_id, finished_at, claim_n, ended_by) END
    FROM judged
    WHERE claim_worker IS DISTINCT FROM worker_id OR ended_by IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING 1
), last AS (
    SELECT finished_at, id FROM done ORDER BY finished_at DESC, id DESC LIMIT 1
)
SELECT coalesce((SELECT finished_at FROM last), $1) AS last_at,
       coalesce((SELECT id FROM last), $2) AS last_id,
       (SELECT count(*) FROM found)::int AS found;

-- name: audit_now
-- grant: jobq_reaper
-- The invariant monitor, on the rows as they are now ($1: the grace, s):
-- a lease lapsed longer ago than the grace and still not requeued (I3), and
-- a ready job (due, waiting on nothing, not parked, its queue not paused)
-- the relay has not published within the grace after its relay time (I1).
-- At most 1,000 of each a call; recorded once per job; how many are new.
WITH overdue AS (
    SELECT j.id, j.queue, j.worker_id, j.lease_expires_at
    FROM jobq.job j
    WHERE j.status = 'active' AND j.lease_expires_at < now() - make_interval(secs => $1)
    LIMIT 1000
), unpublished AS (
    SELECT j.id, j.queue, j.relay_after
    FROM jobq.job j
    WHERE j.status = 'queued' AND j.published_at IS NULL
      AND j.relay_after < now() - make_interval(secs => $1)
      AND j.waiting_on = 0 AND j.run_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM jobq.queue q WHERE q.name = j.queue AND q.paused)
    LIMIT 1000
), found AS (
    INSERT INTO jobq.invariant_violation (kind, job_id, queue, detail)
    SELECT 'overdue_lease', id, queue,
           format('the lease of %s lapsed at %s and no reaper requeued it', worker_id,
                  lease_expires_at)
    FROM overdue
    UNION ALL
    SELECT 'unpublished', id, queue,
           format('ready since %s and not published by the relay', relay_after)
    FROM unpublished
    ON CONFLICT DO NOTHING
    RETURNING kind
)
SELECT count(*) FILTER (WHERE kind = 'overdue_lease')::int AS overdue_lease,
       count(*) FILTER (WHERE kind = 'unpublished')::int AS unpublished
FROM found;

-- name: audit_list
-- `jobq audit`: the violations recorded ($1: one job, or NULL for all).
SELECT kind, job_id, queue, event_n, detail, detected_at
FROM jobq.invariant_violation
WHERE $1::uuid IS NULL OR job_id = $1
ORDER BY detected_at, kind, job_id;

-- name: audit_runs
-- `jobq audit ID`: the job's runs from its history, each claim with the
-- event that ended it (NULL: the run is live, or it completed).
SELECT c.n, c.at, c.worker_id, c.attempt,
       e.event AS ended_by, e.at AS ended_at, e.worker_id AS ended_worker
FROM jobq.job_event c
LEFT JOIN LATERAL (
    SELECT x.event, x.at, x.worker_id FROM jobq.job_event x
    WHERE x.job_id = c.job_id AND x.n > c.n AND x.event IN ('claimed', 'retry', 'failed', 'released', 'stalled', 'cancelled',
                            'child_died', 'snoozed', 'rate_limited', 'superseded',
                            'suspended', 'completed')
    ORDER BY x.n
    LIMIT 1) e ON true
WHERE c.job_id = $1 AND c.event = 'claimed'
ORDER BY c.n;

-- ───────────────────────────── workers ─────────────────────────────

-- name: worker_busy
-- A consumer that ran nothing has claimed jobs: wake the reapers from an idle
-- sleep (reaper/wakes.py), so a crash right after is noticed at the busy
-- pace. At commit; the same payload is one notification per transaction.
SELECT pg_notify('jobq_busy', '');

-- name: worker_lock
-- A session-level advisory lock held for the worker's life on its registry
-- connection; it vanishes with the session.
SELECT pg_try_advisory_lock($1);

-- name: client_check_interval
-- The registry session (PostgreSQL 14 and later): a statement running for a
-- client that went away ends within a second (registry.py).
SET client_connection_check_interval = '1s';

-- name: worker_register
-- grant: jobq_consumer
-- Only for the caller's own session: it must hold the advisory lock $4 it
-- registers (worker_lock, same session), and a worker id already registered
-- is taken over only from a session that is gone (its lock no longer held)
-- or that is this one. Otherwise no row: a live worker's id cannot be
-- borrowed to make the reapers cut its leases.
INSERT INTO jobq.worker AS w (worker_id, host, pid, lock_key, backend_pid)
SELECT $1, $2, $3, $4, pg_backend_pid()
WHERE EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = ($4::bigint >> 32)::bigint::oid
      AND l.objid = ($4::bigint & 4294967295)::bigint::oid
      AND l.objsubid = 1)
ON CONFLICT (worker_id) DO UPDATE
SET lock_key = excluded.lock_key, backend_pid = excluded.backend_pid,
    last_seen_at = now(), vanished_at = NULL
WHERE w.backend_pid = pg_backend_pid()
   OR NOT EXISTS (
       SELECT 1 FROM pg_locks l
       WHERE l.locktype = 'advisory' AND l.granted
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
         AND l.classid = (w.lock_key >> 32)::bigint::oid
         AND l.objid = (w.lock_key & 4294967295)::bigint::oid
         AND l.objsubid = 1)
RETURNING w.worker_id;

-- name: worker_gone
-- grant: jobq_consumer
-- Graceful stop: the worker released its leases; nothing to shorten. Only
-- from the worker's own registry session.
UPDATE jobq.worker SET vanished_at = now(), drained = true
WHERE worker_id = $1 AND backend_pid = pg_backend_pid();

-- name: worker_pool
-- grant: jobq_consumer
-- The worker says how it runs handlers (requeue_lapsed judges by it), from
-- its own registry session only.
UPDATE jobq.worker SET pool = $2
WHERE worker_id = $1 AND backend_pid = pg_backend_pid();

-- name: worker_handlers
-- grant: jobq_consumer
-- The retry options the worker's app declares (schema 0037: per queue, per
-- named task, only what differs from the queue's row), from its own
-- registry session only; jobq queue list shows them.
UPDATE jobq.worker SET handlers = $2::jsonb
WHERE worker_id = $1 AND backend_pid = pg_backend_pid();

-- name: workers_vanished
-- Reaper: registered workers whose registry session (advisory lock) is gone.
-- Their leases are shortened to the queue's vanished_grace_s, not reclaimed:
-- a worker that only lost its connection re-registers and renews in time.
WITH gone AS (
    UPDATE jobq.worker w
    SET vanished_at = now()
    WHERE w.vanished_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM pg_locks l
          WHERE l.locktype = 'advisory'
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid = (w.lock_key >> 32)::bigint::oid
            AND l.objid = (w.lock_key & 4294967295)::bigint::oid
            AND l.objsubid = 1
            AND l.granted)
    RETURNING w.worker_id
), cut AS (
    -- In id order, as every multi-row write of job rows locks them (the
    -- worker's batched complete, fail, renew and release: lease.in_lock_order;
    -- the claim): a worker whose session was cut is often alive and
    -- completing these very jobs (tests/integration/test_lock_order.py).
    SELECT j.id
    FROM jobq.job j JOIN gone ON j.worker_id = gone.worker_id
    WHERE j.status = 'active'
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), shortened AS (
    UPDATE jobq.job j
    SET lease_expires_at = least(j.lease_expires_at,
                                 now() + make_interval(secs => q.vanished_grace_s))
    FROM cut, jobq.queue q
    WHERE j.id = cut.id AND j.status = 'active' AND q.name = j.queue
    RETURNING j.id, j.worker_id, j.attempts, q.history, q.vanished_grace_s
), logged AS (
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, 'worker_vanished', worker_id, attempts,
           format('its database session ended; lease shortened to %ss', vanished_grace_s)
    FROM shortened WHERE history
)
SELECT g.worker_id, (SELECT count(*) FROM shortened s WHERE s.worker_id = g.worker_id) AS jobs
FROM gone g;

-- name: workers_prune
DELETE FROM jobq.worker WHERE vanished_at < now() - interval '1 day';

-- name: lease_lost_event
-- grant: jobq_consumer
-- Worker side: it learned it lost a lease (renewal matched nothing, or it
-- fenced itself). Best effort, for the history only. Fenced by the lost
-- run's token $2 (the row keeps it until the next claim); who and which
-- attempt are the row's, not the caller's word.
INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
SELECT j.id, 'lease_lost', j.worker_id, j.attempts, $3
FROM jobq.job j JOIN jobq.queue q ON q.name = j.queue
WHERE j.id = $1 AND j.lock = $2 AND q.history;

-- ───────────────────────────── operator verbs ─────────────────────────────

-- name: cancel
-- queued -> cancelled at once; active -> cancelled, and the worker learns it
-- on its next renewal (fenced writes need status = 'active') and stops.
-- The job and the children it joins are locked first, all of them, in id
-- order as every multi-row write (schema 0017), whatever scan the updates'
-- plans take: it locked the parent first and then its children in scan
-- order, and deadlocked with a consumer claiming two of those children in
-- one batch (CI; test_lock_order.py). The count(*) makes the lock one
-- step before any row is written.
WITH family AS MATERIALIZED (  -- read, not locked
    SELECT ARRAY[j.id] || coalesce(j.joining, '{}') AS ids FROM jobq.job j WHERE j.id = $1
), locked AS MATERIALIZED (
    SELECT j.id FROM jobq.job j
    WHERE j.id = ANY((SELECT ids FROM family)::uuid[])
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), cancelled AS (
    UPDATE jobq.job j
    SET status = 'cancelled', lease_expires_at = NULL, finished_at = now(),
        last_error = coalesce($2, 'cancelled')
    FROM jobq.queue q
    WHERE j.id = $1 AND j.status COLLATE "C" IN ('queued', 'active') AND q.name = j.queue
      AND (SELECT count(*) FROM locked) > 0
    RETURNING j.id, j.worker_id, j.attempts, q.history, j.joining
), children AS (  -- a joining parent's children it still waits for (schema 0029)
    UPDATE jobq.job c
    SET status = 'cancelled', lease_expires_at = NULL, finished_at = now(),
        last_error = format('cancelled: its parent %s was cancelled', $1::uuid)
    FROM cancelled p
    WHERE c.id = ANY(p.joining) AND c.status COLLATE "C" IN ('queued', 'active')
    RETURNING c.id, c.worker_id, c.attempts, c.last_error
), logged AS (
    -- By the caller, not by the job's worker: the event once named the worker
    -- that held the job (a dead one, for a job cancelled after a crash).
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, 'cancelled', NULL, attempts, format('%s (by %s)', coalesce($2, 'cancelled'),
                                                   session_user)
    FROM cancelled WHERE history
    UNION ALL
    SELECT id, 'cancelled', NULL, attempts, last_error FROM children
)
SELECT id FROM cancelled;

-- name: retry_failed
-- failed/cancelled -> queued with fresh error and stall allowances; a job
-- that waits for others waits again for those not completed (its lock is
-- NULL then: nothing to publish), and is refused while one of them failed,
-- was cancelled or is gone (refused: why). jobq.retry_job, schema 0024.
SELECT id, queue, lock, refused FROM jobq.retry_job($1, $2);

-- name: cancel_queue_batch
-- jobq cancel --queue Q: up to $3 jobs of queue $1 in the states $2 (queued,
-- active), locked in id order as every multi-row write (schema 0017), each
-- cancelled as `cancel` does one (an active one stops at its worker's next
-- renewal). The CLI repeats it until fewer than $3 come back: short locks.
WITH doomed AS (
    SELECT id FROM jobq.job
    WHERE queue = $1 AND status COLLATE "C" = ANY($2::text[])
    ORDER BY id
    LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED
), cancelled AS (
    UPDATE jobq.job j
    SET status = 'cancelled', lease_expires_at = NULL, finished_at = now(),
        last_error = coalesce($4, 'cancelled with its queue by an operator')
    FROM doomed, jobq.queue q
    WHERE j.id = doomed.id AND j.status COLLATE "C" IN ('queued', 'active') AND q.name = j.queue
    RETURNING j.id, j.worker_id, j.attempts, q.history
), logged AS (  -- by the caller, as in cancel
    INSERT INTO jobq.job_event (job_id, event, worker_id, attempt, detail)
    SELECT id, 'cancelled', NULL, attempts,
           format('%s (by %s)', coalesce($4, 'cancelled with its queue by an operator'),
                  session_user)
    FROM cancelled WHERE history
)
SELECT count(*) FROM cancelled;

-- name: retry_queue_batch
-- jobq retry --queue Q: up to $3 failed (or cancelled: $2) jobs of queue $1
-- back in line, each as `retry_failed` does one; the rows (id, queue, lock:
-- NULL for one that waits for others again) to publish, and the refused
-- (the relay publishes if the CLI dies first). $4: ids refused earlier in
-- this run, not tried again.
SELECT r.id, r.queue, r.lock, r.refused
FROM (SELECT j.id FROM jobq.job j
      WHERE j.queue = $1 AND j.status COLLATE "C" = ANY($2::text[])
        AND j.status COLLATE "C" IN ('failed', 'cancelled')
        AND j.id <> ALL ($4::uuid[])
      ORDER BY j.id
      LIMIT $3) t
CROSS JOIN LATERAL jobq.retry_job(t.id, 'with its queue by an operator') r;

-- name: queue_job_counts
-- Jobs of queue $1 per state (the bulk verbs' dry runs and `queue delete`).
SELECT status::text AS status, count(*) AS n FROM jobq.job WHERE queue = $1 GROUP BY status;

-- name: queue_delete
-- jobq queue delete Q: the queue row, its finished jobs and their history,
-- only if no job of it is queued or active and no schedule fires into it
-- (checked under the queue row's lock, which every enqueue into it takes
-- FOR KEY SHARE through the foreign key); the numbers deleted, or no row
-- when the queue does not exist or is not empty.
WITH q AS (
    SELECT name FROM jobq.queue WHERE name = $1 FOR UPDATE
), live AS (
    SELECT count(*) AS n FROM jobq.job j, q
    WHERE j.queue = q.name AND j.status COLLATE "C" IN ('queued', 'active')
), scheduled AS (
    SELECT count(*) AS n FROM jobq.schedule s, q WHERE s.queue = q.name
), ok AS (
    SELECT q.name FROM q, live, scheduled WHERE live.n = 0 AND scheduled.n = 0
), events AS (
    DELETE FROM jobq.job_event e USING jobq.job j, ok
    WHERE e.job_id = j.id AND j.queue = ok.name
), jobs AS (
    DELETE FROM jobq.job j USING ok WHERE j.queue = ok.name RETURNING j.id
), holds AS (
    DELETE FROM jobq.key_hold h USING ok WHERE h.queue = ok.name
), tiers AS (
    DELETE FROM jobq.key_limit t USING ok WHERE t.queue = ok.name
), gone AS (
    DELETE FROM jobq.queue WHERE name IN (SELECT name FROM ok) RETURNING name
)
SELECT (SELECT name FROM q) AS queue, (SELECT n FROM live) AS live,
       (SELECT n FROM scheduled) AS schedules, (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM gone) AS deleted;

-- name: prune_batch
-- Delete finished jobs in small batches (short locks; history goes with them).
WITH doomed AS (
    SELECT id FROM jobq.job
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => $1)
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM jobq.job_event e USING doomed WHERE e.job_id = doomed.id
)
DELETE FROM jobq.job j USING doomed WHERE j.id = doomed.id;

-- name: prune_count
SELECT count(*) FROM jobq.job
WHERE status IN ('completed', 'failed', 'cancelled')
  AND finished_at < now() - make_interval(secs => $1);

-- name: prune_expired
-- Reapers: finished jobs past their queue's retention, oldest first, in a
-- small batch. The range test on finished_at (older than the shortest
-- retention of any queue) keeps the scan on job_finished_idx's old end.
WITH doomed AS (
    SELECT j.id
    FROM jobq.job j
    JOIN jobq.queue q ON q.name = j.queue
    WHERE j.status IN ('completed', 'failed', 'cancelled')
      AND j.finished_at < now() - make_interval(secs => (
              SELECT coalesce(min(least(keep_completed_s, keep_failed_s)), 315360000)
              FROM jobq.queue))
      AND j.finished_at < now() - make_interval(secs => CASE
              WHEN j.status = 'completed' THEN q.keep_completed_s ELSE q.keep_failed_s END)
    ORDER BY j.finished_at
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
), events AS (
    DELETE FROM jobq.job_event e USING doomed WHERE e.job_id = doomed.id
)
DELETE FROM jobq.job j USING doomed WHERE j.id = doomed.id;

-- name: key_rate_prune
-- Reapers, with retention: windowed idempotency keys whose hold ended are
-- forgotten (1,000 a round); per-key rate buckets idle for an hour are full
-- again, which is what a missing row means; a key's claim lock with no job
-- of its key waiting or running is made again by the next claim that needs
-- it (a delete waits for a claim holding it, a moment; the lock is a mutex
-- and nothing else: gone between claims, it is made anew).
WITH buckets AS (
    DELETE FROM jobq.key_rate WHERE at < now() - interval '1 hour'
), holds AS (  -- windowed idempotency keys nobody holds any more (schema 0032):
    -- a hold a producer has locked now is skipped, never waited for
    DELETE FROM jobq.job_unique u
    WHERE (u.queue, u.login, u.key) IN (
        SELECT x.queue, x.login, x.key FROM jobq.job_unique x
        WHERE CASE WHEN x.while_live
                   THEN NOT EXISTS (SELECT 1 FROM jobq.job j WHERE j.id = x.job_id
                                      AND j.status IN ('queued', 'active'))
                   ELSE x.held_until < now() END
        LIMIT 1000
        FOR UPDATE SKIP LOCKED)
)
DELETE FROM jobq.key_lock l
WHERE NOT EXISTS (SELECT 1 FROM jobq.job j
                  WHERE j.queue = l.queue AND j.key = l.key
                    AND j.status IN ('queued', 'active'));

-- name: history
-- The view adds the events the row keeps ('enqueued', 'completed'), which
-- have no n (schema 0011).
SELECT n, at, event, worker_id, attempt, detail
FROM jobq.history
WHERE job_id = $1
ORDER BY at, n;

-- ───────────────────────────── reapers ─────────────────────────────

-- name: reaper_register
INSERT INTO jobq.reaper (reaper_id, host, pid) VALUES ($1, $2, $3)
ON CONFLICT (reaper_id) DO NOTHING;

-- name: reaper_swept
-- $3: what a duty of the sweep raised (the others went on), or NULL.
-- Returns jobq.overdue as it stands (the metrics), in the same round trip.
WITH swept AS (
    UPDATE jobq.reaper
    SET last_sweep_at = now(), sweeps = sweeps + $2, last_error = $3::text,
        failing_since = CASE WHEN $3::text IS NULL THEN NULL
                             ELSE coalesce(failing_since, now()) END
    WHERE reaper_id = $1
)
SELECT overdue_leases, oldest_overdue_s FROM jobq.overdue;

-- name: reaper_failed
-- Best effort (the database may be what fails): shown in jobq.reaper_status.
UPDATE jobq.reaper
SET last_error = $2, failing_since = coalesce(failing_since, now())
WHERE reaper_id = $1;

-- name: reaper_gone
-- A reaper that stops cleanly leaves the status view.
DELETE FROM jobq.reaper WHERE reaper_id = $1;

-- ───────────────────────────── queues ─────────────────────────────

-- name: queue_ensure
-- grant: jobq_consumer
INSERT INTO jobq.queue (name) VALUES ($1) ON CONFLICT (name) DO NOTHING;

-- name: queue_list
-- The rows, and what the handlers of consumers alive now declare over them
-- (schema 0037; each distinct declaration once).
SELECT name, lease_s, max_stalls, max_attempts, timeout_s, backoff_base_s,
       backoff_max_s, stall_cooldown_s, max_payload_bytes, vanished_grace_s,
       keep_completed_s, keep_failed_s, history, max_result_bytes, max_running, rate_per_s,
       max_running_per_key, rate_per_s_per_key, key_policy, priority_aging_s,
       halt_on_failure, paused,
       (SELECT jsonb_agg(DISTINCT w.handlers -> q.name) FROM jobq.worker w
        WHERE w.vanished_at IS NULL AND w.handlers ? q.name) AS handlers_declare
FROM jobq.queue q
ORDER BY name;

-- name: queue_update
-- $2: a JSON object of the settings to change (services/jobq/queues.py lists
-- them, with their bounds); a setting not in it stays as it is, and 0
-- removes a limit that may be absent (timeout_s, keep_*_s, max_running,
-- rate_per_s).
UPDATE jobq.queue
SET lease_s = coalesce(($2::jsonb->>'lease_s')::float8, lease_s),
    max_stalls = coalesce(($2::jsonb->>'max_stalls')::int, max_stalls),
    max_attempts = coalesce(($2::jsonb->>'max_attempts')::int, max_attempts),
    timeout_s = CASE WHEN $2::jsonb ? 'timeout_s'
                     THEN nullif(($2::jsonb->>'timeout_s')::float8, 0) ELSE timeout_s END,
    backoff_base_s = coalesce(($2::jsonb->>'backoff_base_s')::float8, backoff_base_s),
    backoff_max_s = coalesce(($2::jsonb->>'backoff_max_s')::float8, backoff_max_s),
    stall_cooldown_s = coalesce(($2::jsonb->>'stall_cooldown_s')::float8, stall_cooldown_s),
    max_payload_bytes = coalesce(($2::jsonb->>'max_payload_bytes')::int, max_payload_bytes),
    keep_completed_s = CASE WHEN $2::jsonb ? 'keep_completed_s'
                            THEN nullif(($2::jsonb->>'keep_completed_s')::float8, 0)
                            ELSE keep_completed_s END,
    keep_failed_s = CASE WHEN $2::jsonb ? 'keep_failed_s'
                         THEN nullif(($2::jsonb->>'keep_failed_s')::float8, 0)
                         ELSE keep_failed_s END,
    vanished_grace_s = coalesce(($2::jsonb->>'vanished_grace_s')::float8, vanished_grace_s),
    history = coalesce(($2::jsonb->>'history')::bool, history),
    max_result_bytes = coalesce(($2::jsonb->>'max_result_bytes')::int, max_result_bytes),
    max_running = CASE WHEN $2::jsonb ? 'max_running'
                       THEN nullif(($2::jsonb->>'max_running')::int, 0) ELSE max_running END,
    rate_per_s = CASE WHEN $2::jsonb ? 'rate_per_s'
                      THEN nullif(($2::jsonb->>'rate_per_s')::float8, 0) ELSE rate_per_s END,
    max_running_per_key = CASE WHEN $2::jsonb ? 'max_running_per_key'
                               THEN nullif(($2::jsonb->>'max_running_per_key')::int, 0)
                               ELSE max_running_per_key END,
    rate_per_s_per_key = CASE WHEN $2::jsonb ? 'rate_per_s_per_key'
                              THEN nullif(($2::jsonb->>'rate_per_s_per_key')::float8, 0)
                              ELSE rate_per_s_per_key END,
    key_policy = coalesce($2::jsonb->>'key_policy', key_policy),
    priority_aging_s = CASE WHEN $2::jsonb ? 'priority_aging_s'
                            THEN nullif(($2::jsonb->>'priority_aging_s')::float8, 0)
                            ELSE priority_aging_s END,
    halt_on_failure = coalesce(($2::jsonb->>'halt_on_failure')::bool, halt_on_failure)
WHERE name = $1
RETURNING name, lease_s, max_stalls, max_attempts, timeout_s, backoff_base_s,
          backoff_max_s, stall_cooldown_s, max_payload_bytes, vanished_grace_s,
          keep_completed_s, keep_failed_s, history, max_result_bytes, max_running, rate_per_s,
          max_running_per_key, rate_per_s_per_key, key_policy, priority_aging_s,
          halt_on_failure;

-- name: queue_pause
-- jobq queue pause: from the next claim on, no job of the queue starts
-- anywhere (the claim parks what is delivered); running jobs finish;
-- publishing goes on. No row: no such queue. Who paused it and when are
-- kept ($2: the login, or the dashboard's operator) until it resumes.
UPDATE jobq.queue SET paused = true, paused_at = now(), paused_by = $2
WHERE name = $1 RETURNING name;

-- name: queue_resume
-- jobq queue resume: the queue's parked jobs go back to the relay at once
-- (the claim applies the queue's limits again), and the reapers are woken
-- to publish them. No row: no such queue.
WITH resumed AS (
    UPDATE jobq.queue SET paused = false, paused_at = NULL, paused_by = NULL
    WHERE name = $1 RETURNING name
), parked AS (  -- locked in id order, as every multi-row write
    SELECT j.id FROM jobq.job j JOIN resumed ON j.queue = resumed.name
    WHERE j.status = 'queued' AND j.published_at IS NULL
      AND j.relay_after = 'infinity' AND j.waiting_on = 0
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), released AS (
    UPDATE jobq.job j SET relay_after = now()
    FROM parked
    WHERE j.id = parked.id AND j.status = 'queued' AND j.published_at IS NULL
      AND j.relay_after = 'infinity'
    RETURNING j.id
)
SELECT r.name, (SELECT count(*) FROM released) AS released,
       (SELECT count(*) FROM (SELECT pg_notify('jobq_relay', r.name)) n) AS woken
FROM resumed r;

-- name: key_stats
-- jobq keys [QUEUE]: per key, what waits, what runs, the oldest wait, until
-- when a jobq.RateLimited holds it (schema 0026), and the limits that apply
-- to it (its tier's, schema 0036, else the queue's per-key defaults; tier
-- says which). Keys with a tier and nothing queued or running are listed too.
WITH keys AS (
    SELECT s.queue, s.key, s.queued, s.running, s.oldest_wait_s FROM jobq.key_stats s
    WHERE $1::text IS NULL OR s.queue = $1
    UNION ALL
    SELECT t.queue, t.key, 0, 0, NULL FROM jobq.key_limit t
    WHERE ($1::text IS NULL OR t.queue = $1)
      AND NOT EXISTS (SELECT 1 FROM jobq.key_stats s WHERE s.queue = t.queue AND s.key = t.key)
)
SELECT k.queue, k.key, k.queued, k.running,
       round(k.oldest_wait_s::numeric, 1)::float8 AS oldest_wait_s, h.until AS held_until,
       coalesce(t.max_running, q.max_running_per_key) AS max_running,
       coalesce(t.rate_per_s, q.rate_per_s_per_key) AS rate_per_s,
       t.key IS NOT NULL AS tier
FROM keys k
JOIN jobq.queue q ON q.name = k.queue
LEFT JOIN jobq.key_limit t ON t.queue = k.queue AND t.key = k.key
LEFT JOIN jobq.key_hold h ON h.queue = k.queue AND h.key = k.key AND h.until > now()
ORDER BY k.queue, k.queued DESC, k.key
LIMIT 1000;

-- name: key_limit_set
-- jobq keys set Q KEY: the key's tier. $3/$4: max running / rate per second,
-- NULL to keep, 0 to drop that one (both gone: no tier). Refused (no row)
-- on a queue without per-key limits, where a tier would apply to nothing.
WITH q AS (
    SELECT name FROM jobq.queue
    WHERE name = $1 AND (max_running_per_key IS NOT NULL OR rate_per_s_per_key IS NOT NULL)
), old AS (
    SELECT max_running, rate_per_s FROM jobq.key_limit WHERE queue = $1 AND key = $2
), new AS (
    SELECT nullif(coalesce($3::int, (SELECT max_running FROM old)), 0) AS max_running,
           nullif(coalesce($4::float8, (SELECT rate_per_s FROM old)), 0) AS rate_per_s
), dropped AS (
    DELETE FROM jobq.key_limit t USING new, q
    WHERE t.queue = q.name AND t.key = $2 AND new.max_running IS NULL AND new.rate_per_s IS NULL
), stored AS (
    INSERT INTO jobq.key_limit AS t (queue, key, max_running, rate_per_s)
    SELECT q.name, $2, new.max_running, new.rate_per_s FROM q, new
    WHERE new.max_running IS NOT NULL OR new.rate_per_s IS NOT NULL
    ON CONFLICT (queue, key) DO UPDATE
    SET max_running = excluded.max_running, rate_per_s = excluded.rate_per_s,
        set_at = now(), set_by = session_user
)
SELECT q.name AS queue, $2::text AS key, new.max_running, new.rate_per_s FROM q, new;

-- name: queue_limits_get
SELECT auto_create, max_queues, (SELECT count(*) FROM jobq.queue) AS queues
FROM jobq.queue_limits;

-- name: queue_limits_set
UPDATE jobq.queue_limits
SET auto_create = coalesce($1, auto_create), max_queues = coalesce($2, max_queues)
RETURNING auto_create, max_queues, (SELECT count(*) FROM jobq.queue) AS queues;

-- ───────────────────────────── inspect ─────────────────────────────

-- name: stats
SELECT queue, queued, delayed, waiting, parked, suspended, running, stalled, completed,
       failed, cancelled, extract(epoch FROM oldest_queued_age)::float8 AS oldest_queued_s,
       completed_last_minute AS done_1m, paused
FROM jobq.queue_stats
ORDER BY queue;

-- name: job_status
SELECT status FROM jobq.job WHERE id = $1;

-- name: job_get
SELECT id, queue, payload, status, lock, worker_id, lease_expires_at, attempts, errors, stalls,
       last_error, idempotency_key, run_at, published_at, created_at, started_at,
       finished_at, progress, progress_at, result, priority, key, waiting_on, workflow_id,
       snoozes, key_policy, wake_on, joining, expires_at, idempotency_scope, last_traceback,
       w.since AS suspended_since,
       CASE WHEN w.since IS NOT NULL AND run_at < now() + interval '99 years'
            THEN run_at END AS wakes_at  -- none for a wait with no timeout (100 years)
FROM jobq.job,
     LATERAL (SELECT CASE WHEN status = 'queued' AND suspended_at > started_at  -- waits now
                               AND run_at > now() THEN suspended_at END AS since) w
WHERE id = $1;

-- name: job_links
-- jobq inspect, the dashboard: what a job waits for and what waits for it,
-- the children it spawned and the job that spawned it (its step
-- 'spawn:<name>', found through job_step_spawned_idx, schema 0038).
SELECT 'waits for' AS link, p.id, p.queue, p.status
FROM jobq.job_dependency d JOIN jobq.job p ON p.id = d.parent_id
WHERE d.job_id = $1
UNION ALL
SELECT 'waited for by', c.id, c.queue, c.status
FROM jobq.job_dependency d JOIN jobq.job c ON c.id = d.job_id
WHERE d.parent_id = $1
UNION ALL
SELECT 'spawned', c.id, c.queue, c.status
FROM jobq.job_step s JOIN jobq.job c ON c.id = (s.result #>> '{}')::uuid
WHERE s.job_id = $1 AND s.fn = 'jobq.spawn'
UNION ALL
SELECT 'spawned by', p.id, p.queue, p.status
FROM jobq.job_step s JOIN jobq.job p ON p.id = s.job_id
WHERE (s.result #>> '{}') = $1::text AND s.fn = 'jobq.spawn';

-- name: job_steps
-- jobq inspect: a job's durable steps, in the order they were recorded.
SELECT name, fn, attempt, at, result FROM jobq.job_step WHERE job_id = $1 ORDER BY at, name;

-- name: workflow_jobs
-- jobq inspect WORKFLOW_ID: its steps in the order they were published, with
-- what each waits for, and the children its steps spawned (job.spawn, and
-- theirs in turn; spawned_by: the job whose step made it, NULL for a step).
-- The children are followed through the spawn steps' primary key.
WITH RECURSIVE member(id, spawned_by) AS (
    SELECT j.id, NULL::uuid FROM jobq.job j WHERE j.workflow_id = $1
    UNION
    SELECT (s.result #>> '{}')::uuid, s.job_id
    FROM member m JOIN jobq.job_step s ON s.job_id = m.id AND s.fn = 'jobq.spawn'
)
SELECT j.id, j.queue, j.status, j.waiting_on, j.created_at, j.finished_at, j.last_error,
       ARRAY(SELECT d.parent_id FROM jobq.job_dependency d WHERE d.job_id = j.id
             ORDER BY d.parent_id) AS after,
       m.spawned_by
FROM member m JOIN jobq.job j ON j.id = m.id
ORDER BY j.created_at, j.id;

-- name: workflow_cancel
-- jobq cancel WORKFLOW_ID: every step not started yet (a running one
-- finishes; what waits for a cancelled step is cancelled by the reapers'
-- settler, jobq.settle_dependants).
WITH steps AS (  -- locked in id order, as every multi-row write (schema 0017)
    SELECT id FROM jobq.job WHERE workflow_id = $1 AND status = 'queued'
    ORDER BY id
    FOR NO KEY UPDATE
), cancelled AS (
    UPDATE jobq.job j
    SET status = 'cancelled', lease_expires_at = NULL, finished_at = now(), waiting_on = 0,
        last_error = coalesce($2, 'cancelled with its workflow')
    FROM steps
    WHERE j.id = steps.id AND j.status = 'queued'
    RETURNING j.id
)
SELECT count(*) FROM cancelled;

-- ───────────────────────────── dashboard ─────────────────────────────
-- One page load is a few of these; each reads through a partial index
-- (queued, active, failed, finished), never the whole table
-- (bench/dashboard.py measures them on a 1 M-row table).

-- name: dash_queues
-- Counts per queue, stalled right now included (a lease that lapsed, not
-- yet reaped), in one round trip; what is queued by state from
-- jobq.backlog (schema 0030: "queued" is what could start now).
SELECT q.name AS queue,
       coalesce(b.ready, 0) AS queued, coalesce(b.delayed, 0) AS delayed,
       coalesce(b.waiting, 0) AS waiting, coalesce(b.parked, 0) AS parked,
       coalesce(b.suspended, 0) AS suspended,
       (SELECT count(*) FROM jobq.job j WHERE j.queue = q.name AND j.status = 'active'
          AND j.lease_expires_at >= now()) AS running,
       (SELECT count(*) FROM jobq.job j WHERE j.queue = q.name AND j.status = 'active'
          AND j.lease_expires_at < now()) AS stalled,
       (SELECT count(*) FROM jobq.job j WHERE j.queue = q.name AND j.status = 'failed')
          AS failed,
       CASE WHEN b.ready > 0 THEN b.oldest_ready_s END AS oldest_wait_s,
       (SELECT count(*) FROM jobq.job j WHERE j.queue = q.name AND j.status = 'cancelled'
          AND j.finished_at > now() - interval '1 hour') AS cancelled_1h,  -- job_finished_idx
       q.max_running, q.rate_per_s, q.max_running_per_key, q.rate_per_s_per_key, q.paused,
       q.key_policy, q.priority_aging_s, q.halt_on_failure
FROM jobq.queue q
LEFT JOIN jobq.backlog b ON b.queue = q.name
ORDER BY q.name;

-- name: dash_jobs
-- The dashboard's job list of a queue ($1), newest first, filtered by
-- status ($2), key ($3) and workflow ($4) when given, a page ($7 rows)
-- before ($5 created_at, $6 id): keyset paging, stable while jobs come in.
SELECT id, status, key, workflow_id, attempts, errors, stalls, suspect_stalls, created_at,
       started_at, finished_at, last_error
FROM jobq.job
WHERE queue = $1
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR key = $3)
  AND ($4::uuid IS NULL OR workflow_id = $4)
  AND ($5::timestamptz IS NULL OR (created_at, id) < ($5, $6::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $7;

-- name: job_prefix
-- The jobs whose ids lie in [$1, $2] (a short id's range: ops/common.id_range),
-- two at most: one is the job, two say the short id is ambiguous.
SELECT id FROM jobq.job WHERE id BETWEEN $1 AND $2 ORDER BY id LIMIT 2;

-- name: workflow_prefix
-- The same for workflow ids (job_workflow_idx).
SELECT DISTINCT workflow_id AS id FROM jobq.job
WHERE workflow_id BETWEEN $1 AND $2 ORDER BY 1 LIMIT 2;

-- name: dash_throughput
-- Completions per queue and minute over the last hour (0 = this minute).
SELECT queue, floor(extract(epoch FROM now() - finished_at) / 60)::int AS minutes_ago,
       count(*) AS n
FROM jobq.job
WHERE status = 'completed' AND finished_at > now() - interval '1 hour'
GROUP BY 1, 2;

-- name: dash_running
SELECT id, queue, worker_id, attempts, stalls, suspect_stalls, started_at,
       extract(epoch FROM lease_expires_at - now())::float8 AS lease_left_s, progress
FROM jobq.job
WHERE status = 'active' AND lease_expires_at >= now()
ORDER BY started_at
LIMIT $1;

-- name: dash_stalled
SELECT id, queue, worker_id, attempts, stalls, suspect_stalls, started_at,
       extract(epoch FROM now() - lease_expires_at)::float8 AS overdue_s
FROM jobq.job
WHERE status = 'active' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT $1;

-- name: dash_failed
SELECT id, queue, attempts, errors, stalls, suspect_stalls, last_error, finished_at
FROM jobq.job
WHERE status = 'failed'
ORDER BY finished_at DESC
LIMIT $1;

-- name: dash_job
SELECT id, queue, payload, status, worker_id, attempts, errors, stalls, suspect_stalls,
       snoozes, last_error, idempotency_key, run_at, created_at, started_at, finished_at,
       extract(epoch FROM lease_expires_at - now())::float8 AS lease_left_s, progress, result,
       workflow_id, last_traceback, key, key_policy, wake_on, joining, expires_at,
       idempotency_scope,
       w.since AS suspended_since,
       CASE WHEN w.since IS NOT NULL AND run_at < now() + interval '99 years'
            THEN run_at END AS wakes_at  -- none for a wait with no timeout (100 years)
FROM jobq.job,
     LATERAL (SELECT CASE WHEN status = 'queued' AND suspended_at > started_at  -- waits now
                               AND run_at > now() THEN suspended_at END AS since) w
WHERE id = $1;

-- name: dash_output
-- The job page: the last $2 chunks of its streamed output (schema 0033), newest
-- first, on the primary key.
SELECT n, attempt, chunk::text AS chunk, at
FROM jobq.job_output
WHERE job_id = $1
ORDER BY n DESC
LIMIT $2;

-- name: dash_workers
-- session_alive: the worker's registry session (its advisory lock) exists
-- now, read here, not from vanished_at: that one is the reapers' word, and
-- with every reaper down a killed consumer would look alive for good.
SELECT w.worker_id, w.host, w.pid, w.started_at, w.last_seen_at, w.vanished_at, w.drained,
       extract(epoch FROM now() - w.last_seen_at)::float8 AS silent_s,
       (SELECT count(*) FROM jobq.job j WHERE j.worker_id = w.worker_id
          AND j.status = 'active') AS jobs,
       w.vanished_at IS NULL AND EXISTS (
           SELECT 1 FROM pg_locks l
           WHERE l.locktype = 'advisory'
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND l.classid = (w.lock_key >> 32)::bigint::oid
             AND l.objid = (w.lock_key & 4294967295)::bigint::oid
             AND l.objsubid = 1 AND l.granted) AS session_alive
FROM jobq.worker w
ORDER BY w.vanished_at IS NOT NULL, w.started_at DESC
LIMIT 200;

-- name: reader_member
-- The dashboard's login reads as jobq_reader when it is a member.
SELECT to_regrole('jobq_reader') IS NOT NULL
       AND pg_has_role(current_user, 'jobq_reader', 'MEMBER');

-- name: dash_reapers
SELECT reaper_id, host, pid, started_at, last_sweep_at, sweeps, seconds_since_sweep,
       last_error, failing_since
FROM jobq.reaper_status
ORDER BY reaper_id;

-- ───────────────────────────── install ─────────────────────────────
-- jobq migrate --create-database: run on the server's maintenance database.

-- name: database_exists
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1);

-- name: create_database_statement
-- CREATE DATABASE takes no parameters: the server quotes the name.
SELECT format('CREATE DATABASE %I', $1::text);

-- jobq migrate (migrate.py, routines.py): roles, the migration ledger and
-- the statement functions. DDL that names an object takes no parameters:
-- a statement here writes it, the server quoting the names.

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1);

-- name: role_create_statement
SELECT format('CREATE ROLE %I NOLOGIN', $1::text);

-- name: current_login
SELECT current_user::text;

-- name: session_login
-- The login itself, whatever role the session acts as (who paused a queue).
SELECT session_user::text;

-- name: owner_joined
SELECT pg_has_role('jobq_owner', 'USAGE');

-- name: owner_join
GRANT jobq_owner TO CURRENT_USER;

-- name: schema_owner
SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'jobq';

-- name: as_owner
SET LOCAL ROLE jobq_owner;

-- name: roles_shared_with
-- Other databases of the cluster where these (group) roles own something or
-- hold a right: a login granted one of them reaches those too (jobq migrate
-- warns; roles.py).
SELECT DISTINCT d.datname
FROM pg_shdepend s
JOIN pg_database d ON d.oid = s.dbid
WHERE s.refclassid = 'pg_authid'::regclass
  AND s.refobjid IN (SELECT oid FROM pg_roles WHERE rolname = ANY($1::text[]))
  AND s.dbid <> (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY 1;

-- name: schema_present
-- Migrated at all (services refuse to start otherwise: "run jobq migrate").
SELECT to_regclass('jobq.job');

-- name: database_name
-- Which database a message speaks of ("database jobq_demo has no jobq schema").
SELECT current_database();

-- name: schema_namespace
SELECT to_regnamespace('jobq');

-- name: schema_create
CREATE SCHEMA jobq;

-- name: migrations_present
SELECT to_regclass('jobq.schema_migration');

-- name: migrations_create
CREATE TABLE IF NOT EXISTS jobq.schema_migration (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());

-- name: migrations_applied
SELECT version, checksum FROM jobq.schema_migration;

-- name: migration_record
INSERT INTO jobq.schema_migration (version, name, checksum) VALUES ($1, $2, $3);

-- name: lock_timeout_local
-- A migration under load waits this long for each lock, then tries again.
SELECT set_config('lock_timeout', $1::text, true);

-- name: migrate_lock
SELECT pg_advisory_lock($1);

-- name: migrate_unlock
SELECT pg_advisory_unlock($1);

-- name: type_names
-- The parameter types of a statement, by name, for its function's signature.
SELECT format_type(o, NULL) AS t FROM unnest($1::oid[]) WITH ORDINALITY AS u(o, n) ORDER BY n;

-- name: routines_present
SELECT to_regclass('jobq.schema_routine');

-- name: routines_create
CREATE TABLE IF NOT EXISTS jobq.schema_routine (name text PRIMARY KEY, checksum text NOT NULL);

-- name: routines_installed
SELECT name, checksum FROM jobq.schema_routine;

-- name: routine_record
INSERT INTO jobq.schema_routine (name, checksum) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum;

-- name: routine_forget
DELETE FROM jobq.schema_routine WHERE name = $1;

-- name: routine_drop_statement
-- $1 is jobq.q_<name>, made by routines.function_name from a statement's name.
SELECT format('DROP FUNCTION IF EXISTS %s', $1::text);

-- name: routine_grant_statements
-- Only the roles of the statement's grant line may call its function.
SELECT format('REVOKE ALL ON FUNCTION %s(%s) FROM PUBLIC', $1::text, $2::text) AS revoke,
       format('GRANT EXECUTE ON FUNCTION %s(%s) TO %s', $1::text, $2::text,
              (SELECT string_agg(quote_ident(r), ', ') FROM unnest($3::text[]) AS r)) AS grant;

-- name: ping
-- Readiness (/readyz): the database answers.
SELECT 1;

-- name: rollback
-- A pooled session given back inside a transaction (db._light_reset).
ROLLBACK;

-- ───────────────────────────── uninstall ─────────────────────────────
-- jobq uninstall (uninstall.py): what migrate made in this database, and
-- the group roles where no other database uses them.

-- name: uninstall_database_name
SELECT current_database();

-- name: uninstall_schema_exists
SELECT to_regnamespace('jobq') IS NOT NULL;

-- name: uninstall_job_count
SELECT count(*) FROM jobq.job;

-- name: uninstall_roles_present
SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[]) ORDER BY rolname;

-- name: uninstall_schema
-- The schema and everything in it, then what the group roles still own or
-- were granted in this database (the database-wide default privileges of
-- jobq_owner, CONNECT): DROP OWNED is per database, so another database's
-- jobq is untouched. A role the user may not act for is skipped.
DO $$
DECLARE
    r text;
BEGIN
    DROP SCHEMA IF EXISTS jobq CASCADE;
    FOREACH r IN ARRAY ARRAY['jobq_owner', 'jobq_producer', 'jobq_consumer', 'jobq_reaper',
                             'jobq_reader'] LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r);
        BEGIN
            EXECUTE format('DROP OWNED BY %I', r);
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END LOOP;
END $$;

-- name: uninstall_roles
-- Each group role that nothing in another database depends on (ownership
-- or a grant there: pg_shdepend); kept otherwise, or if the user may not
-- drop it. Logins that were members just lose the membership.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['jobq_owner', 'jobq_producer', 'jobq_consumer', 'jobq_reaper',
                             'jobq_reader'] LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r);
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM pg_shdepend d JOIN pg_roles ro ON ro.oid = d.refobjid
            WHERE ro.rolname = r AND d.dbid NOT IN (0, (SELECT oid FROM pg_database
                                                        WHERE datname = current_database())));
        BEGIN
            EXECUTE format('DROP ROLE %I', r);
        EXCEPTION WHEN insufficient_privilege OR dependent_objects_still_exist THEN
            NULL;
        END;
    END LOOP;
END $$;
