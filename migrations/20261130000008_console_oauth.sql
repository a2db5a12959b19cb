-- Console sessions, login throttling, and the OAuth 2.1 authorization server's clients,
-- codes and grants.

CREATE TABLE console_sessions (
    id           BIGSERIAL PRIMARY KEY,
    token_hash   BYTEA NOT NULL UNIQUE,
    person_id    BIGINT NOT NULL REFERENCES people(id) ON DELETE CASCADE,
    -- The tenant the person is working in; NULL until picked.
    tenant_id    BIGINT REFERENCES tenants(id) ON DELETE CASCADE,
    csrf_token   TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL
);

-- Failed sign-ins per email, for throttling.
CREATE TABLE login_failures (
    id      BIGSERIAL PRIMARY KEY,
    email   TEXT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX login_failures_email_idx ON login_failures (lower(email), at);

-- Clients: registered dynamically (RFC 7591) or identified by a metadata document URL.
CREATE TABLE oauth_clients (
    id             BIGSERIAL PRIMARY KEY,
    client_id      TEXT NOT NULL UNIQUE,
    client_name    TEXT NOT NULL,
    redirect_uris  TEXT[] NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('registered', 'metadata_document')),
    fetched_at     TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE oauth_codes (
    id              BIGSERIAL PRIMARY KEY,
    code_hash       BYTEA NOT NULL UNIQUE,
    client_id       TEXT NOT NULL,
    connection_id   BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    redirect_uri    TEXT NOT NULL,
    code_challenge  TEXT NOT NULL,
    resource        TEXT NOT NULL,
    expires_at      TIMESTAMPTZ NOT NULL,
    used_at         TIMESTAMPTZ
);

-- An OAuth connection remembers its client; one connection per client, tenant and person.
ALTER TABLE connections ADD COLUMN oauth_client_id TEXT;
CREATE UNIQUE INDEX connections_oauth_idx ON connections (tenant_id, creator_id, oauth_client_id)
    WHERE oauth_client_id IS NOT NULL AND status = 'active';

-- Refresh tokens are kept after use to detect reuse (which revokes the connection).
ALTER TABLE connection_tokens ADD COLUMN used_at TIMESTAMPTZ;
