-- Least privilege (issue #14). The group roles (NOLOGIN) exist before this
-- runs: migrate.py creates them, because roles belong to the whole cluster
-- and creating one needs CREATEROLE, which a migration should not assume.
-- A deployment grants each service's login role exactly one of them:
--   jobq_producer  enqueue (jobq.enqueue, the Python client, the CLI) and mark
--                  its own publishes; reads no job row, changes no state
--   jobq_consumer  claim, renew, finish, release: only through the fenced
--                  statements (jobq.q_* functions, generated from queries.sql
--                  by routines.py); grant it jobq_producer as well to let
--                  handlers enqueue follow-up jobs
--   jobq_reaper    sweep, relay, prune: the rows it must move, no DDL
--   jobq_reader    every table and view, read only (the CLI's read verbs)
--   jobq_owner     owns the schema and everything in it; `jobq migrate` runs
--                  as a login role that is a member of it
-- tests/integration/test_roles.py diffs the rights below against its list.

-- Everything already here belongs to jobq_owner from now on, so ownership
-- does not depend on which login happened to run the first migration.
DO $$
DECLARE
    o record;
BEGIN
    EXECUTE 'ALTER SCHEMA jobq OWNER TO jobq_owner';
    FOR o IN
        SELECT c.relname AS name, c.relkind AS kind
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'jobq' AND c.relkind IN ('r', 'v', 'p')
    LOOP
        EXECUTE format('ALTER %s jobq.%I OWNER TO jobq_owner',
                       CASE o.kind WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END, o.name);
    END LOOP;
    FOR o IN
        SELECT p.oid::regprocedure AS fn
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'jobq'
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO jobq_owner', o.fn);
    END LOOP;
END $$;

-- Functions are created EXECUTE-able by PUBLIC unless this says otherwise;
-- jobq's must be granted one by one.
ALTER DEFAULT PRIVILEGES FOR ROLE jobq_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA jobq FROM PUBLIC;
REVOKE ALL ON SCHEMA jobq FROM PUBLIC;
GRANT USAGE ON SCHEMA jobq TO jobq_producer, jobq_consumer, jobq_reaper, jobq_reader;

-- Producer: enqueue runs as its owner (SECURITY DEFINER, search_path
-- pinned: every name in it is schema-qualified, and pg_temp comes last).
ALTER FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
GRANT EXECUTE ON FUNCTION jobq.enqueue(text, jsonb, double precision, text, double precision)
    TO jobq_producer;
-- Queue settings are not secret: the client checks payload sizes against them.
GRANT SELECT ON jobq.queue TO jobq_producer, jobq_consumer;

-- Reaper: the rows it moves (requeue, relay, prune, vanished workers).
GRANT SELECT, UPDATE, DELETE ON jobq.job TO jobq_reaper;
GRANT SELECT, INSERT, DELETE ON jobq.job_event TO jobq_reaper;
GRANT SELECT, UPDATE, DELETE ON jobq.worker TO jobq_reaper;
GRANT SELECT, INSERT, UPDATE, DELETE ON jobq.reaper TO jobq_reaper;
GRANT SELECT ON jobq.queue, jobq.overdue TO jobq_reaper;

-- Reader: everything, read only; tables and views added later too.
GRANT SELECT ON ALL TABLES IN SCHEMA jobq TO jobq_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE jobq_owner IN SCHEMA jobq GRANT SELECT ON TABLES TO jobq_reader;
