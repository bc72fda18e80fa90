-- Priority aging (issue #51, item 6): jobq queue set Q --priority-aging-s N.
-- A waiting job gains one priority level every N seconds it has been due
-- (since run_at), so under a flood of high-priority jobs a low one starts
-- within a bound: after 10 N s its level is above any fresh 9. NULL (the
-- default): no aging, priorities as before. The level is computed where
-- jobs are ordered (the claim's swap and its limits, the release of parked
-- jobs), never stored: nothing has to rewrite waiting rows as they age.
ALTER TABLE jobq.queue ADD COLUMN priority_aging_s double precision
    CONSTRAINT queue_priority_aging_s_check
    CHECK (priority_aging_s >= 1 AND priority_aging_s <= 604800);
COMMENT ON COLUMN jobq.queue.priority_aging_s IS
    'A waiting job gains a priority level every this many seconds it has been due '
    '(NULL: no aging; schema 0040)';

-- A job's level now: its priority, plus one per aging_s since it was due.
-- An SQL function of one expression, with no SET clause: the planner inlines
-- it. Run by the reapers' unpark (as key_tier is) and inside the claim.
CREATE FUNCTION jobq.aged(priority integer, due timestamptz, aging_s double precision)
    RETURNS double precision
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT priority + CASE WHEN aging_s IS NULL OR due > now() THEN 0
                           ELSE floor(extract(epoch FROM now() - due) / aging_s) END
$$;
REVOKE ALL ON FUNCTION jobq.aged(integer, timestamptz, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.aged(integer, timestamptz, double precision) TO jobq_reaper;
