-- What migrate changes stays inside schema jobq (issue #33): 0006 revoked
-- EXECUTE from PUBLIC on every function jobq_owner would create anywhere in
-- the database (a database-wide default privilege, which outlived DROP
-- SCHEMA jobq and kept DROP ROLE jobq_owner from working). PostgreSQL cannot
-- revoke a default per schema, so the default is restored here and every
-- migration from now on revokes EXECUTE on the functions it creates, as
-- routines.py does for the q_* functions; tests/integration/test_roles.py
-- fails on any jobq function PUBLIC may run.
ALTER DEFAULT PRIVILEGES FOR ROLE jobq_owner GRANT EXECUTE ON FUNCTIONS TO PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA jobq FROM PUBLIC;

-- A consumer stopped by SIGTERM drains, releases its jobs and says so
-- (worker_gone); one that died is found by the reapers (workers_vanished).
-- Both set vanished_at; drained tells them apart, so the dashboard no longer
-- paints a clean stop red like a crash.
ALTER TABLE jobq.worker ADD COLUMN drained boolean NOT NULL DEFAULT false;
