-- Children decided at run time (issue #52, item 4; DESIGN I12): a running
-- job spawns a child once per name (the child's insert and the step that
-- records its id commit together, in the consumers' spawn statement, so a
-- parent killed right after spawning never spawns that child again), and
-- joins children by parking until all have ended (job.joining: the ids it
-- waits for). The reapers' wake duty makes a joining job due once none of
-- its children is queued or running; it looks at the state, not at an event,
-- so a child that ends while its parent parks is seen at the next sweep.
-- Cancelling a joining parent cancels the children it still waits for.
ALTER TABLE jobq.job ADD COLUMN joining uuid[];
COMMENT ON COLUMN jobq.job.joining IS
    'The children a suspended job waits for (job.join); NULL otherwise.';
CREATE INDEX job_joining_idx ON jobq.job (id) WHERE joining IS NOT NULL;
GRANT UPDATE (joining) ON jobq.job TO jobq_reaper;
