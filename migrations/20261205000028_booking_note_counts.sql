-- A booking's notes count without a hotspot: the count was a column of the booking, so every
-- note written updated (and rewrote) the booking's row, and writers adding notes to one busy
-- booking waited for each other's commits on it. The count now lives in up to sixteen rows
-- per booking, one per shard (the writing backend's pid modulo 16), summed when read: a
-- primary-key lookup of at most sixteen small rows, whatever the booking's history (R21).
SET LOCAL lock_timeout = '10s';

-- Bookings first, then notes, as before: no note is written between the copy and the trigger.
LOCK TABLE bookings IN ACCESS EXCLUSIVE MODE;
LOCK TABLE booking_notes IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE booking_note_counts (
    booking_id  BIGINT NOT NULL REFERENCES bookings(id) ON DELETE CASCADE,
    shard       SMALLINT NOT NULL CHECK (shard BETWEEN 0 AND 15),
    n           BIGINT NOT NULL,
    PRIMARY KEY (booking_id, shard)
);

INSERT INTO booking_note_counts (booking_id, shard, n)
SELECT id, 0, notes_count FROM bookings WHERE notes_count <> 0;

CREATE OR REPLACE FUNCTION booking_notes_count() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    s SMALLINT := (pg_backend_pid() % 16)::smallint;
BEGIN
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.booking_id <> OLD.booking_id) THEN
        INSERT INTO booking_note_counts AS c (booking_id, shard, n) VALUES (NEW.booking_id, s, 1)
        ON CONFLICT (booking_id, shard) DO UPDATE SET n = c.n + 1;
    END IF;
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND NEW.booking_id <> OLD.booking_id) THEN
        -- A booking being deleted takes its counts with it (cascade).
        IF EXISTS (SELECT 1 FROM bookings WHERE id = OLD.booking_id) THEN
            INSERT INTO booking_note_counts AS c (booking_id, shard, n) VALUES (OLD.booking_id, s, -1)
            ON CONFLICT (booking_id, shard) DO UPDATE SET n = c.n - 1;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION booking_notes_truncated() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM booking_note_counts;
    RETURN NULL;
END
$$;

-- The old column stays (no longer kept) until no running worker reads it: workers of the
-- previous release serve during a rolling upgrade. A later migration drops it.
