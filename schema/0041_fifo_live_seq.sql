-- A fifo key's live jobs in publish order (issue #51 with #49's flat-work
-- rule). The claim's "an earlier job of the key not ended" and the release
-- of a key's next job walked job_key_seq_idx, which keeps every job of the
-- key until retention deletes it: a key with 10,000 finished jobs read
-- 1,510 buffers per job (bench/fifo_depth.py). This index holds only the
-- queued and active ones, so both read the head and stop.
CREATE INDEX job_key_live_seq_idx ON jobq.job (queue, key, seq)
    WHERE seq IS NOT NULL AND status IN ('queued', 'active');
