-- A limited queue's allowance, defined once (issue #17's token bucket and
-- max_running were written out twice: in the claim, which decides, and in
-- the reapers' unpark, which meters what is published). Plain SQL functions,
-- STABLE and without SET clauses, so the planner inlines them where they are
-- called: no call overhead on the claim.

-- Tokens of a queue's rate bucket now: it refills at rate_per_s and holds at
-- most one second's worth (at least 1); NULL when the queue has no rate limit.
CREATE FUNCTION jobq.rate_tokens(q jobq.queue) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN q.rate_per_s IS NOT NULL THEN
        least(greatest(q.rate_per_s, 1),
              q.rate_tokens + q.rate_per_s * extract(epoch FROM now() - q.rate_at)) END
$$;

-- How many more of the queue's jobs may start now, given how many are active:
-- free max_running slots and whole rate tokens, the smaller (each absent
-- limit: no bound, 2147483647). The caller counts the active jobs: a
-- sub-SELECT in here would stop the planner from inlining it.
CREATE FUNCTION jobq.allowance(q jobq.queue, active bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT greatest(0, least(coalesce(q.max_running - active, 2147483647),
                             coalesce(floor(jobq.rate_tokens(q))::bigint, 2147483647)))
$$;

-- The claim calls them as the schema's owner; the reapers' unpark as itself.
REVOKE ALL ON FUNCTION jobq.rate_tokens(jobq.queue), jobq.allowance(jobq.queue, bigint)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.rate_tokens(jobq.queue), jobq.allowance(jobq.queue, bigint)
    TO jobq_reaper;

-- jobq.enqueue and jobq.enqueue_many keep their statements' plans in the
-- session (PL/pgSQL); like the generated jobq.q_* functions they plan every
-- call for its arguments whatever the session says, since behind PgBouncer
-- (JOBQ_DATABASE_POOLED) the setting jobq sends at login does not arrive.
ALTER FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION jobq.enqueue_many(text[], jsonb[], double precision[], text[], double precision)
    SET plan_cache_mode = force_custom_plan;
