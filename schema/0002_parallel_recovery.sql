-- Parallel recovery (issue #12): a crash costs each of its jobs one re-run.
--
-- Until now every job of a worker that died holding several became a
-- suspect and ran alone, so N jobs of a dead worker re-ran one after another.
-- Now a shared crash only makes each job a *witness* (suspect_stalls + 1) and
-- it runs again at once, in parallel. Only a job present at a second crash
-- becomes a suspect, and a worker then runs it *isolated*: at most one
-- suspect at a time, with its other slots still busy with other jobs. The
-- row says which job was isolated when a worker died, so the reaper charges
-- that one and nobody else (see requeue_lapsed in queries.sql).

ALTER TABLE jobq.job
    ADD COLUMN isolated boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN jobq.job.isolated IS
    'true while this active run is the one suspect its worker isolates: if the '
    'worker dies now, this job alone is charged a stall';
COMMENT ON COLUMN jobq.job.suspect_stalls IS
    'crashes this job was present at together with other jobs (witness count); '
    'at 2 it becomes a suspect';

-- New history events: a suspect starting its isolated run, and a child
-- process that died running the job (--pool process), which the consumer
-- attributes exactly.
ALTER TABLE jobq.job_event DROP CONSTRAINT job_event_event_check;
ALTER TABLE jobq.job_event ADD CONSTRAINT job_event_event_check CHECK (event IN (
    'enqueued', 'published', 'claimed', 'completed', 'retry', 'failed',
    'released', 'stalled', 'lease_lost', 'cancelled', 'retried',
    'republished', 'worker_vanished', 'isolated', 'child_died'));
