-- Failures you can debug (issue #50, DESIGN "Failures you can debug"): the
-- last failure's traceback is kept with the job, beside last_error. The
-- consumer cuts it to the innermost 20 frames and 8 KB (worker/tracebacks.py);
-- the CHECK bounds what any writer can store, so a hostile handler's text
-- costs its own row at most (I11).
ALTER TABLE jobq.job
    ADD COLUMN last_traceback text
        CONSTRAINT job_last_traceback_size CHECK (octet_length(last_traceback) <= 16384);

COMMENT ON COLUMN jobq.job.last_traceback IS
    'The traceback of the last failed run (innermost frames, at most 8 KB as written by '
    'the consumer); NULL when the last failure had none (a timeout, a lost child).';

CREATE OR REPLACE VIEW jobq.failed AS
SELECT id, queue, attempts, errors, stalls, last_error, finished_at, payload, last_traceback
FROM jobq.job
WHERE status = 'failed';
