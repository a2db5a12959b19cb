-- The tenant's policy set behind an audited decision of an agent's call or a pending action:
-- `{"version": N, "decided_by": ["policy-id", …]}` (the ids empty when the set allowed it).
-- Absent on rows written with no set in force. Chain version 2 covers it: the canonical form
-- names it when present and omits it when absent, so every link written before keeps
-- verifying unchanged.
ALTER TABLE audit_log ADD COLUMN policy JSONB;
