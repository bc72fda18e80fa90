-- What applies to a queue's jobs (issue #50, item 4): retries declared next
-- to a handler (@app.handler(queue, max_attempts=..., retry_on=...)) win over
-- the queue's row for that handler's jobs. Each consumer says, from its own
-- registry session, what its app declares (per queue, per named task), and
-- `jobq queue list` shows it beside the row, from consumers alive now.
ALTER TABLE jobq.worker
    ADD COLUMN handlers jsonb CHECK (handlers IS NULL OR pg_column_size(handlers) <= 65536);
COMMENT ON COLUMN jobq.worker.handlers IS
    'Retry options its app declares per queue and task, over the queues'' rows.';
