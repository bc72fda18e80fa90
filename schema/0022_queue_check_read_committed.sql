-- The queue rule of 0021 under REPEATABLE READ and SERIALIZABLE (found in
-- review): a queue delete, rename or truncate checked for jobs with its
-- transaction's snapshot, so in those levels it missed a job inserted and
-- committed after that snapshot was taken (the insert's KEY SHARE lock had
-- made the delete wait, not fail) and left the job without its queue, never
-- claimable. The foreign key it replaced checked with a fresh snapshot and
-- failed such a transaction with a serialization failure. A plpgsql
-- function cannot take a fresh snapshot in those levels, so these checks
-- now run only in READ COMMITTED (PostgreSQL's default, and jobq's own:
-- jobq queue delete) and refuse the others with that same error: retry it
-- in READ COMMITTED.
CREATE OR REPLACE FUNCTION jobq.check_queue_unused() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'queue "%" can be deleted or renamed only in READ COMMITTED', OLD.name
            USING ERRCODE = 'serialization_failure',
                  HINT = 'a transaction of this isolation level cannot see jobs committed '
                         'since it began; run it in READ COMMITTED (the default)';
    END IF;
    IF EXISTS (SELECT 1 FROM jobq.job j WHERE j.queue = OLD.name) THEN
        RAISE EXCEPTION 'queue "%" still has jobs', OLD.name
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'jobq queue delete removes a queue with its finished jobs';
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION jobq.check_queues_truncated() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'jobq.queue can be truncated only in READ COMMITTED'
            USING ERRCODE = 'serialization_failure',
                  HINT = 'a transaction of this isolation level cannot see jobs committed '
                         'since it began; run it in READ COMMITTED (the default)';
    END IF;
    IF EXISTS (SELECT 1 FROM jobq.job) THEN
        RAISE EXCEPTION 'jobq.queue cannot be truncated while jobq.job has rows'
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'TRUNCATE jobq.job and jobq.queue in one command';
    END IF;
    RETURN NULL;
END;
$$;
