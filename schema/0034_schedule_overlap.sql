-- Schedules (issue #51, item 8): an overlap policy, and a record of the
-- slots it skipped.
--   overlap 'allow' (the default, as before): every slot enqueues a job.
--   overlap 'skip': a slot whose schedule still has a live job (queued,
--     delayed, retrying, suspended or running: the last job it enqueued)
--     enqueues nothing; the slot is skipped and kept in skipped_slots (the
--     latest 100; skipped_total counts them all). The check and the enqueue
--     happen under the schedule's row lock, so two reapers, a reaper and
--     `jobq schedule trigger` never put two of its jobs in line at once.
ALTER TABLE jobq.schedule
    ADD COLUMN overlap text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip')),
    ADD COLUMN skipped_slots timestamptz[] NOT NULL DEFAULT '{}'
        CHECK (cardinality(skipped_slots) <= 100),
    ADD COLUMN skipped_total bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN jobq.schedule.overlap IS
    'allow: a job every slot; skip: no slot enqueues while the last job is queued or running.';
COMMENT ON COLUMN jobq.schedule.skipped_slots IS
    'The latest 100 slots skipped by overlap skip, oldest first.';
