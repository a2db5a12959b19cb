-- An action that waited for a person and expired with nobody deciding gets one audit row
-- (housekeeping writes it and marks the action), so an admin arriving late reads what happened.
ALTER TABLE pending_actions ADD COLUMN expiry_audited_at TIMESTAMPTZ;
CREATE INDEX pending_actions_unaudited_expiry_idx ON pending_actions (expires_at)
    WHERE status = 'pending' AND completion = 'person_approves' AND expiry_audited_at IS NULL;
