-- The audit log (R19, R23): who did what through which channel, with public ids only.
-- Arguments and personal data never land here.
CREATE TABLE audit_log (
    id               BIGSERIAL PRIMARY KEY,
    tenant_id        BIGINT REFERENCES tenants(id) ON DELETE CASCADE,
    at               TIMESTAMPTZ NOT NULL DEFAULT now(),
    channel          TEXT NOT NULL CHECK (channel IN ('mcp', 'api', 'console', 'cli', 'system')),
    actor_id         BIGINT REFERENCES people(id),
    connection_id    BIGINT REFERENCES connections(id) ON DELETE SET NULL,
    connection_name  TEXT,
    client_name      TEXT,
    action           TEXT NOT NULL,
    outcome          TEXT NOT NULL CHECK (outcome IN ('ok', 'refused', 'failed')),
    targets          TEXT[] NOT NULL DEFAULT '{}',
    request_id       TEXT
);
CREATE INDEX audit_log_tenant_at_idx ON audit_log (tenant_id, at DESC);
CREATE INDEX audit_log_connection_idx ON audit_log (connection_id, at DESC);
