-- A booking keeps the count of its notes, so reading a booking costs the same whether it has
-- two notes or ten thousand (R21: no result, and no read, grows with a record's history).
-- A trigger keeps it, so every way a note is written (tools, the console, demo data, a
-- support script) counts.
-- Fail fast rather than queue every booking read behind this migration's lock.
SET LOCAL lock_timeout = '10s';

-- Bookings first, then notes: the order add_booking_note takes them in (it locks the booking's
-- row, then inserts the note), and no note is written between the count and the trigger.
LOCK TABLE bookings IN ACCESS EXCLUSIVE MODE;
LOCK TABLE booking_notes IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE bookings ADD COLUMN notes_count BIGINT NOT NULL DEFAULT 0;

UPDATE bookings b SET notes_count = n.total
FROM (SELECT booking_id, count(*) AS total FROM booking_notes GROUP BY booking_id) n
WHERE n.booking_id = b.id;

CREATE FUNCTION booking_notes_count() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE bookings SET notes_count = notes_count + 1 WHERE id = NEW.booking_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE bookings SET notes_count = notes_count - 1 WHERE id = OLD.booking_id;
    ELSIF NEW.booking_id <> OLD.booking_id THEN
        UPDATE bookings SET notes_count = notes_count - 1 WHERE id = OLD.booking_id;
        UPDATE bookings SET notes_count = notes_count + 1 WHERE id = NEW.booking_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER booking_notes_count AFTER INSERT OR DELETE OR UPDATE OF booking_id ON booking_notes
    FOR EACH ROW EXECUTE FUNCTION booking_notes_count();

CREATE FUNCTION booking_notes_truncated() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE bookings SET notes_count = 0 WHERE notes_count <> 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER booking_notes_truncated AFTER TRUNCATE ON booking_notes
    FOR EACH STATEMENT EXECUTE FUNCTION booking_notes_truncated();
