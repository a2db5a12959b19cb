-- no-transaction
-- A note an agent wrote (over MCP) may carry what a third party planted in what the agent read,
-- and one an integration wrote (REST) comes from another system: both are stored with their
-- source and shown wrapped as untrusted text (R13), like a customer's. Staff notes (console)
-- stay plain.
--
-- The wider check is added NOT VALID in a short transaction and validated in another, under a
-- lock that lets writes go on, so a large notes table is scanned without stopping writers.
BEGIN;
SET LOCAL lock_timeout = '5s';
ALTER TABLE booking_notes DROP CONSTRAINT IF EXISTS booking_notes_source_check;
ALTER TABLE booking_notes ADD CONSTRAINT booking_notes_source_check
    CHECK (source IN ('staff', 'customer', 'external', 'agent')) NOT VALID;
COMMIT;

-- Notes written over MCP or REST before this were stored as staff notes; the audit log names
-- the channel of every note written (its targets hold the note's handle).
BEGIN;
SET LOCAL lock_timeout = '5s';
UPDATE booking_notes n
   SET source = CASE a.channel WHEN 'mcp' THEN 'agent' ELSE 'external' END
  FROM audit_log a
 WHERE a.action = 'add_booking_note' AND a.channel IN ('mcp', 'api')
   AND n.source = 'staff' AND n.handle = ANY (a.targets);
COMMIT;

BEGIN;
SET LOCAL lock_timeout = '5s';
ALTER TABLE booking_notes VALIDATE CONSTRAINT booking_notes_source_check;
COMMIT;
