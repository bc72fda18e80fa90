-- A live invariant monitor (issue #50, item 8). The reapers read the history
-- jobq already keeps (job_event, the job rows) and record here every job that
-- breaks one of jobq's promises, once per job and kind:
--   two_live_leases          a job claimed by a worker while another
--                            worker's claim had not ended (I2);
--   completed_without_lease  a completion by a worker that did not hold the
--                            job's latest claim, or after that claim ended;
--   overdue_lease            a lease lapsed longer ago than the grace and
--                            still not requeued (I3);
--   unpublished              a ready job the relay has not published within
--                            the grace after its relay time (I1).
-- Only queues that keep history (jobq.queue.history, the default) are read
-- for the first two. Rows stay when their job is pruned: a violation is
-- evidence. jobq audit prints them; jobq_invariant_violations_total counts them.
CREATE TABLE jobq.invariant_violation (
    kind text NOT NULL CHECK (kind IN ('two_live_leases', 'completed_without_lease',
                                       'overdue_lease', 'unpublished')),
    job_id uuid NOT NULL,
    queue text NOT NULL,
    event_n bigint,  -- the job_event that shows it, where one does
    detail text NOT NULL,
    detected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, job_id)
);
COMMENT ON TABLE jobq.invariant_violation IS
    'Jobs that broke one of jobq''s invariants, as the reapers'' audit found them (jobq audit).';
GRANT SELECT ON jobq.invariant_violation TO jobq_reader;
