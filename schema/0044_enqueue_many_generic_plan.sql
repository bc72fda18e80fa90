-- jobq.enqueue_many, the producer's group commit, plans its statements once
-- per session instead of on every call (issue #49). Schema 0010 made it plan
-- every call, like every jobq function, against the generic-plan trap: a
-- plan made while jobq.job was empty keeps sequential scans after the table
-- grew. None of its own statements reads jobq.job: the check reads the
-- arguments and jobq.queue, the insert writes the rows, the NOTIFY reads the
-- arguments; with sequential scans priced out, jobq.queue is read by its key
-- whatever the statistics say (test_enqueue_plans.py checks both). A call
-- outside the plain path goes through jobq.enqueue, which keeps planning
-- every call with its own setting, as jobq.admit_keyed does.
--
-- Planning was most of a one-job publish's server time: a single-row call
-- with its commit took 1.09 ms planned per call and 0.69 ms with one plan
-- per session (p50 of 350 sequential calls, this machine).
ALTER FUNCTION jobq.enqueue_many(text[], jsonb[], double precision[], text[], double precision,
                                 integer[], text[], double precision[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION jobq.enqueue_many(text[], jsonb[], double precision[], text[], double precision,
                                 integer[], text[], double precision[])
    SET enable_seqscan = off;
