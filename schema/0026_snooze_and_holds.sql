-- Flow decided by the handler (issue #51, DESIGN "Key policies and
-- handler-side flow"): jobq.Snooze puts a running job back for a while
-- without counting the run (job.snoozes counts them instead); jobq.RateLimited
-- does the same and holds the job's key fleet-wide until then (jobq.key_hold:
-- key '' holds the whole queue, for a job without a key; a job's key is
-- never empty). The claim refuses a held job (it waits, delayed to the
-- hold's end, for the relay); a claim of a queue without a live hold reads
-- one index entry of key_hold_live_idx to know it.
ALTER TABLE jobq.job ADD COLUMN snoozes integer NOT NULL DEFAULT 0;

CREATE TABLE jobq.key_hold (
    queue text NOT NULL,  -- no foreign key, as key_lock: queue_delete drops its holds
    key text NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);
CREATE INDEX key_hold_live_idx ON jobq.key_hold (queue, until);
COMMENT ON TABLE jobq.key_hold IS
    'Keys held by jobq.RateLimited until a time: no job of the key (of the queue, key '''') '
    'starts before it. Written by the consumers'' snooze statement, read by the claim.';

GRANT SELECT ON jobq.key_hold TO jobq_reader;

-- The history's new events: this migration's, and those of key policies and
-- suspension (issues #51, #52), named once here. NOT VALID then VALIDATE:
-- the check of old rows takes no lock that stops the consumers' inserts.
ALTER TABLE jobq.job_event DROP CONSTRAINT job_event_event_check;
ALTER TABLE jobq.job_event ADD CONSTRAINT job_event_event_check CHECK (event IN (
    'enqueued', 'published', 'claimed', 'completed', 'retry', 'failed', 'released', 'stalled',
    'lease_lost', 'cancelled', 'retried', 'republished', 'worker_vanished', 'isolated',
    'child_died', 'snoozed', 'rate_limited', 'superseded', 'suspended', 'woken', 'signalled',
    'spawned')) NOT VALID;
ALTER TABLE jobq.job_event VALIDATE CONSTRAINT job_event_event_check;
