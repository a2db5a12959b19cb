-- Budgets on effects: how much a connection (and, if the tenant sets one, the whole tenant)
-- may do over a rolling window, counted in effects (customers messaged, bookings changed,
-- technicians paged, alert-minutes muted, records deleted), not in calls. Defaults live in
-- code (services::budgets::default_budget); a row here is a tenant's own setting.
CREATE TABLE budgets (
    id             BIGSERIAL PRIMARY KEY,
    tenant_id      BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    -- NULL: the tenant-wide budget, summed over every connection of the tenant.
    connection_id  BIGINT REFERENCES connections(id) ON DELETE CASCADE,
    kind           TEXT NOT NULL CHECK (kind IN ('customers_messaged', 'bookings_changed',
                                                 'technicians_paged', 'alert_minutes_muted',
                                                 'records_deleted')),
    limit_units    BIGINT NOT NULL CHECK (limit_units >= 0),
    window_secs    INTEGER NOT NULL CHECK (window_secs BETWEEN 60 AND 2592000),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX budgets_connection_kind_idx ON budgets (tenant_id, connection_id, kind)
    WHERE connection_id IS NOT NULL;
CREATE UNIQUE INDEX budgets_tenant_kind_idx ON budgets (tenant_id, kind)
    WHERE connection_id IS NULL;

-- The ledger. A row is written when an action is prepared for an agent to confirm (a
-- reservation: `counted` false, it counts while its pending action is pending, unexpired and
-- the agent's to confirm, so concurrent prepares see each other) and replaced by a counted
-- row when the action executes (whoever completed it). Rejected, expired and superseded
-- actions release their reservation without a write.
CREATE TABLE budget_usage (
    id                 BIGSERIAL PRIMARY KEY,
    tenant_id          BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    connection_id      BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    kind               TEXT NOT NULL,
    amount             BIGINT NOT NULL CHECK (amount > 0),
    at                 TIMESTAMPTZ NOT NULL DEFAULT now(),
    pending_action_id  BIGINT REFERENCES pending_actions(id) ON DELETE CASCADE,
    counted            BOOLEAN NOT NULL
);
CREATE INDEX budget_usage_tenant_kind_idx ON budget_usage (tenant_id, kind, at);
CREATE INDEX budget_usage_pending_idx ON budget_usage (pending_action_id);

-- Why an action waits for a person because of a budget, for the Approvals page.
ALTER TABLE pending_actions ADD COLUMN budget_reason TEXT;
