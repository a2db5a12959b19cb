-- Agent connections and their tokens, API tokens. Tokens are stored as SHA-256 hashes only.
CREATE TABLE connections (
    id              BIGSERIAL PRIMARY KEY,
    tenant_id       BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle          TEXT NOT NULL UNIQUE CHECK (handle LIKE 'con\_%'),
    creator_id      BIGINT NOT NULL REFERENCES people(id),
    name            TEXT NOT NULL,
    client_name     TEXT NOT NULL,
    -- Rights granted at creation, capped by the creator's rights then; the live rights are
    -- these intersected with the creator's current rights on every call (R4).
    rights          TEXT[] NOT NULL,
    status          TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    revoked_reason  TEXT,
    revoked_at      TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used_at    TIMESTAMPTZ
);
CREATE INDEX connections_tenant_idx ON connections (tenant_id, created_at);
CREATE INDEX connections_creator_idx ON connections (creator_id);

CREATE TABLE connection_tokens (
    id             BIGSERIAL PRIMARY KEY,
    connection_id  BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    kind           TEXT NOT NULL CHECK (kind IN ('static', 'access', 'refresh')),
    token_hash     BYTEA NOT NULL UNIQUE,
    -- The MCP resource this token was issued for (RFC 8707); NULL for static tokens,
    -- which are valid for every worker of this deployment.
    audience       TEXT,
    expires_at     TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX connection_tokens_connection_idx ON connection_tokens (connection_id);

CREATE TABLE api_tokens (
    id          BIGSERIAL PRIMARY KEY,
    tenant_id   BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle      TEXT NOT NULL UNIQUE CHECK (handle LIKE 'apt\_%'),
    person_id   BIGINT NOT NULL REFERENCES people(id),
    name        TEXT NOT NULL,
    token_hash  BYTEA NOT NULL UNIQUE,
    revoked_at  TIMESTAMPTZ,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
