-- Switch flips are audited with the operator's reason (R18); the platform switch remembers who
-- set it last.
ALTER TABLE audit_log ADD COLUMN reason TEXT;
ALTER TABLE platform_state ADD COLUMN updated_by TEXT, ADD COLUMN reason TEXT;
