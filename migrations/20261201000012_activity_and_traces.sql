-- What agents did, for the console's pictures: calls per connection, hour, effect class and
-- outcome (counted by the workers and written in batches, off the request path), and the
-- latest calls of each connection (at most 50 kept per connection). Tool names and outcome
-- codes only: never arguments (R14, R23).
CREATE TABLE call_activity (
    tenant_id      BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    connection_id  BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    hour           TIMESTAMPTZ NOT NULL,
    effect_class   TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    calls          BIGINT NOT NULL CHECK (calls >= 0),
    PRIMARY KEY (connection_id, hour, effect_class, outcome)
);
CREATE INDEX call_activity_tenant_hour_idx ON call_activity (tenant_id, hour);

CREATE TABLE recent_calls (
    id             BIGSERIAL PRIMARY KEY,
    tenant_id      BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    connection_id  BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    at             TIMESTAMPTZ NOT NULL,
    tool           TEXT NOT NULL,
    effect_class   TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    duration_ms    REAL NOT NULL
);
CREATE INDEX recent_calls_connection_idx ON recent_calls (connection_id, at DESC, id DESC);
CREATE INDEX recent_calls_tenant_idx ON recent_calls (tenant_id, at DESC, id DESC);

-- The W3C trace context of the call that queued a message, so its delivery joins the trace.
ALTER TABLE outbox ADD COLUMN traceparent TEXT;

-- The audit page filters and pages in SQL: by outcome and action within a tenant's time order.
CREATE INDEX audit_log_tenant_action_idx ON audit_log (tenant_id, action, at DESC);
