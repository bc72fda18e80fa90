-- The dashboard (issue #18) counts failed jobs per queue and lists them
-- newest first; without this index both read every finished row.
CREATE INDEX job_failed_idx ON jobq.job (queue, finished_at) WHERE status = 'failed';
