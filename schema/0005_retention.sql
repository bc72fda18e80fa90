-- Finished jobs are pruned by the reapers, per queue (issue #13), as River's
-- job cleaner and Oban's pruner do: nobody needs a cron job for `jobq prune`.
-- NULL keeps them forever. Small batches (reaper.prune_batch), at most once a
-- minute per reaper (reaper.prune_every_s), FOR UPDATE SKIP LOCKED so reapers
-- share the work.

ALTER TABLE jobq.queue
    ADD COLUMN keep_completed_s double precision DEFAULT 86400
        CONSTRAINT queue_keep_completed_s_range
        CHECK (keep_completed_s IS NULL OR keep_completed_s BETWEEN 60 AND 315360000),
    ADD COLUMN keep_failed_s double precision DEFAULT 604800
        CONSTRAINT queue_keep_failed_s_range
        CHECK (keep_failed_s IS NULL OR keep_failed_s BETWEEN 60 AND 315360000);

COMMENT ON COLUMN jobq.queue.keep_completed_s IS
    'reapers delete completed jobs (and their history) this long after they finished; NULL: never';
COMMENT ON COLUMN jobq.queue.keep_failed_s IS
    'the same for failed and cancelled jobs';
