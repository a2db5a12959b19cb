-- Who completes a prepared action is tenant policy: per effect class (notify, wake, alert,
-- delete) and optionally per tool. A tenant without a row for a class or tool has the default,
-- `agent_confirms`, defined in one place (shared::services::approvals::DEFAULT).
CREATE TABLE approval_policies (
    tenant_id             BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    -- 'class:notify', 'class:wake', 'class:alert', 'class:delete' or 'tool:<name>'.
    scope                 TEXT NOT NULL CHECK (scope ~ '^(class|tool):[a-z_]+$'),
    mode                  TEXT NOT NULL CHECK (mode IN ('agent_confirms', 'person_approves', 'off')),
    -- With person_approves: the approver may not be the person whose connection asked.
    approver_not_creator  BOOLEAN NOT NULL DEFAULT false,
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, scope)
);

-- A pending action remembers who completes it, fixed when it was prepared.
ALTER TABLE pending_actions ADD COLUMN completion TEXT NOT NULL DEFAULT 'agent_confirms'
    CHECK (completion IN ('agent_confirms', 'person_approves'));
ALTER TABLE pending_actions ADD COLUMN approver_not_creator BOOLEAN NOT NULL DEFAULT false;
-- What the person approving is shown: exactly what will be sent or changed.
ALTER TABLE pending_actions ADD COLUMN preview JSONB;
ALTER TABLE pending_actions ADD COLUMN decided_by BIGINT REFERENCES people(id);
ALTER TABLE pending_actions ADD COLUMN decision_reason TEXT;
-- An action that changed before a person approved it points to its new version, so the agent's
-- token follows it.
ALTER TABLE pending_actions ADD COLUMN replaced_by TEXT;
CREATE INDEX pending_actions_awaiting_idx ON pending_actions (tenant_id, created_at)
    WHERE status = 'pending' AND completion = 'person_approves';

-- Audit outcomes of actions a person decides.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_outcome_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_outcome_check
    CHECK (outcome IN ('ok', 'refused', 'failed', 'previewed', 'rejected', 'awaiting_approval', 'denied'));
