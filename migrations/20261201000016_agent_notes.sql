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
ALTER TABLE booking_notes DROP CONSTRAINT booking_notes_source_check;
ALTER TABLE booking_notes ADD CONSTRAINT booking_notes_source_check
    CHECK (source IN ('staff', 'customer', 'external', 'agent')) NOT VALID;
COMMIT;

BEGIN;
SET LOCAL lock_timeout = '5s';
ALTER TABLE booking_notes VALIDATE CONSTRAINT booking_notes_source_check;
COMMIT;
