-- Streamed output (issue #52, item 5): a running handler's chunks
-- (job.emit), kept in order with the job until it is pruned, read from any
-- offset (client.stream). Each chunk names the run that emitted it (its
-- lease token) and that run's attempt, so a reader can mark where a re-run
-- after a crash starts. An emit is fenced like every worker write (only the
-- holder of a live lease adds one) and sends NOTIFY jobq_output with the
-- job's id, a hint that wakes readers at once; they re-read the rows, the
-- truth. A job holds at most 10,000 chunks (jobq.errors.MAX_CHUNKS).
CREATE TABLE jobq.job_output (
    job_id uuid NOT NULL REFERENCES jobq.job (id) ON DELETE CASCADE,
    n integer NOT NULL,  -- 1, 2, ...: the offset a reader resumes after
    run uuid NOT NULL,  -- the emitting run's lease token
    attempt integer NOT NULL,
    chunk jsonb NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, n)
);
COMMENT ON TABLE jobq.job_output IS
    'Chunks a running job emitted (job.emit), in order; pruned with the job.';
GRANT SELECT ON jobq.job_output TO jobq_reader;
