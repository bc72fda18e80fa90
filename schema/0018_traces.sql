-- OpenTelemetry (issue #32, the jobq[otel] extra): the publisher's trace
-- context, stored beside the job by the statement that inserts it
-- (enqueue_many_traced) and read by the consumer before each run, whose
-- span becomes its child. A row only for jobs published inside a recording
-- span; jobs enqueued from SQL or by a schedule have none and start their
-- own trace. Deleted with its job (retention, queue delete).
CREATE TABLE jobq.job_trace (
    job_id  uuid PRIMARY KEY REFERENCES jobq.job (id) ON DELETE CASCADE,
    carrier jsonb NOT NULL CHECK (jsonb_typeof(carrier) = 'object'
                                  AND octet_length(carrier::text) <= 4096)
);
GRANT INSERT ON jobq.job_trace TO jobq_producer;
GRANT SELECT ON jobq.job_trace TO jobq_consumer;
