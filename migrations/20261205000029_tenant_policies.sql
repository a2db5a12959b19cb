-- Tenants' policies in Cedar. Every version is kept (its source, who set it and when), so a
-- change can be read, compared and rolled back; the tenant's row names the version in force,
-- so the connection context every call already reads carries it (a worker's compiled copy is
-- checked against it on every call, with no other round trip).
CREATE TABLE tenant_policies (
    tenant_id  BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    version    INT NOT NULL CHECK (version > 0),
    source     TEXT NOT NULL CHECK (octet_length(source) <= 65536),
    author_id  BIGINT REFERENCES people(id) ON DELETE SET NULL,
    -- Who set it, as shown then (the person may leave; the history stays readable).
    author     TEXT NOT NULL,
    note       TEXT NOT NULL DEFAULT '' CHECK (char_length(note) <= 300),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, version)
);

ALTER TABLE tenants ADD COLUMN policy_version INT NOT NULL DEFAULT 0 CHECK (policy_version >= 0);
