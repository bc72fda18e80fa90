-- Jobs that wait without holding anything (issue #52, DESIGN I12): a
-- handler's job.sleep(name, s) and job.wait_for(name) end its run and put
-- the job back to queued, not counted, with no lease and no slot, due when
-- its timer ends (run_at / relay_after, by the database clock: the relay
-- publishes it then, as any delayed job) or, for a signal, far in the
-- future and woken by the reapers once the signal is there. Never 'infinity':
-- that is a job a limit parked, which the unpark duty would release.
--
-- Signals live in jobq.job_signal, a mailbox per job and name: the first
-- signal of a name is kept (later ones of the same name are refused with
-- false), read by every later run of the job, pruned with the job. A
-- producer's jobq.signal only inserts there (I11: it never writes, so never
-- locks, the job's row; the wake happens only if it commits); the reapers'
-- wake duty moves a job whose awaited signal is in the mailbox back in line.
-- A job suspending checks the mailbox in its own statement, and a signal
-- stays undelivered until a wake or a read of it saw it, so a signal that
-- commits while the job suspends is seen by one or the other: woken once.
ALTER TABLE jobq.job ADD COLUMN wake_on text;  -- the signal name a suspended job waits for
COMMENT ON COLUMN jobq.job.wake_on IS
    'The signal a suspended job waits for (job.wait_for); NULL otherwise.';

CREATE TABLE jobq.job_signal (
    job_id    uuid NOT NULL REFERENCES jobq.job (id) ON DELETE CASCADE,
    name      text NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 200),
    payload   jsonb NOT NULL DEFAULT 'null'::jsonb,
    sent_at   timestamptz NOT NULL DEFAULT now(),
    sent_by   text NOT NULL DEFAULT session_user,
    delivered boolean NOT NULL DEFAULT false,  -- a wake or the job's read saw it
    PRIMARY KEY (job_id, name)
);
CREATE INDEX job_signal_undelivered_idx ON jobq.job_signal (sent_at) WHERE NOT delivered;
COMMENT ON TABLE jobq.job_signal IS
    'Signals sent to jobs (jobq.signal): the first of each name is kept for every run.';
GRANT SELECT ON jobq.job_signal TO jobq_reader;
GRANT SELECT, UPDATE ON jobq.job_signal TO jobq_reaper;  -- its wake duty
GRANT UPDATE (wake_on) ON jobq.job TO jobq_reaper;

CREATE FUNCTION jobq.signal(id uuid, name text, payload jsonb DEFAULT 'null'::jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
-- true: kept; false: a signal of that name was sent to the job before (the
-- first is kept). A job unknown or ended: one clear error, nothing stored.
DECLARE
    st text;
    q text;
    history boolean;
BEGIN
    IF signal.name IS NULL OR octet_length(signal.name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'jobq: a signal name is 1 to 200 bytes, got %', quote_nullable(signal.name)
            USING ERRCODE = '22023', HINT = 'use the name the handler waits for: job.wait_for(name)';
    END IF;
    IF octet_length(coalesce(signal.payload, 'null'::jsonb)::text) > 1048576 THEN
        RAISE EXCEPTION 'jobq: a signal''s payload is at most 1 MB'
            USING ERRCODE = '22001', HINT = 'send a reference to the data, not the data';
    END IF;
    SELECT j.status, j.queue, qq.history INTO st, q, history
    FROM jobq.job j JOIN jobq.queue qq ON qq.name = j.queue WHERE j.id = signal.id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'jobq: no job %', signal.id
            USING ERRCODE = 'P0002', HINT = 'signal a job by the id jobq returned for it';
    END IF;
    IF st NOT IN ('queued', 'active') THEN
        RAISE EXCEPTION 'jobq: job % is %: a signal to an ended job is not kept', signal.id, st
            USING ERRCODE = '55000', HINT = 'signal jobs that are queued or running';
    END IF;
    INSERT INTO jobq.job_signal (job_id, name, payload)
    VALUES (signal.id, signal.name, coalesce(signal.payload, 'null'::jsonb))
    ON CONFLICT (job_id, name) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF history THEN
        INSERT INTO jobq.job_event (job_id, event, detail)
        VALUES (signal.id, 'signalled', format('%s by %s', signal.name, session_user));
    END IF;
    PERFORM pg_notify('jobq_relay', q);  -- at commit: the reapers wake the job
    RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION jobq.signal(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobq.signal(uuid, text, jsonb) TO jobq_producer, jobq_reaper;
