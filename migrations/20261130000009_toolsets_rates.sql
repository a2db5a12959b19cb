-- Toolsets per connection (R21) and rate buckets for the outward effect classes.
ALTER TABLE connections ADD COLUMN toolset TEXT NOT NULL DEFAULT 'full'
    CHECK (toolset IN ('full', 'read_only', 'small'));

-- Fixed one-minute windows per connection and class, shared by every worker.
CREATE TABLE rate_windows (
    connection_id  BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    class          TEXT NOT NULL,
    window_start   TIMESTAMPTZ NOT NULL,
    count          INTEGER NOT NULL,
    PRIMARY KEY (connection_id, class, window_start)
);

-- Per-tenant overrides of the default limits (calls per minute per connection).
CREATE TABLE tenant_rate_limits (
    tenant_id   BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    class       TEXT NOT NULL CHECK (class IN ('read', 'silent_write', 'notify', 'wake', 'alert', 'delete')),
    per_minute  INTEGER NOT NULL CHECK (per_minute >= 0),
    PRIMARY KEY (tenant_id, class)
);
