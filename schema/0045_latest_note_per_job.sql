-- A latest job's note for the reapers' supersede duty (schema 0042) is one
-- row per job, not one per key. With one row per key, a newer job whose
-- transaction committed while a sweep ran left no note of its own (the key's
-- row was there: ON CONFLICT DO NOTHING); the sweep took that row, could not
-- see the newer job in its snapshot, and no later sweep looked at the key
-- again, so its delayed older job stayed queued until it came due (CI saw
-- it). Now every insert writes its own row, and a sweep takes only rows its
-- snapshot sees: one committed after it began is left for the next sweep,
-- and its job is visible to that one. Producers of one key never touch a
-- shared row, so none waits for another's open transaction.
ALTER TABLE jobq.latest_key DROP CONSTRAINT latest_key_pkey;
ALTER TABLE jobq.latest_key ADD COLUMN n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;

CREATE OR REPLACE FUNCTION jobq.note_latest_key() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO jobq.latest_key (queue, key) VALUES (NEW.queue, NEW.key);
    RETURN NULL;
END;
$$;
