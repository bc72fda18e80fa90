-- A fifo key's open jobs in publish order (issue #51 with #49's flat-work
-- rule), and a fifo key that halts on a failure (#51.1's option).
--
-- The claim's "an earlier job of the key not ended" and the release of a
-- key's next job walked job_key_seq_idx, which keeps every job of the key
-- until retention deletes it: a key with 10,000 finished jobs read 1,510
-- buffers per job (bench/fifo_depth.py). This index holds only the queued,
-- active and failed ones (failed: what halts a key, see below; a failed job
-- is rare and leaves with retention), so both read the head and stop.
CREATE INDEX job_key_open_seq_idx ON jobq.job (queue, key, seq)
    WHERE seq IS NOT NULL AND status IN ('queued', 'active', 'failed');

-- jobq queue set Q --halt-on-failure on: in a fifo queue, a key whose job
-- failed for good starts nothing after it until that job is retried (jobq
-- retry ID: it runs first, then the rest in order) or leaves with retention.
-- Off (the default): the failed job is passed and the next one starts.
ALTER TABLE jobq.queue ADD COLUMN halt_on_failure boolean NOT NULL DEFAULT false
    CONSTRAINT queue_halt_on_failure_check CHECK (NOT halt_on_failure OR key_policy = 'fifo');
COMMENT ON COLUMN jobq.queue.halt_on_failure IS
    'fifo queues: a key whose job failed starts nothing after it until jobq retry (schema 0041)';
