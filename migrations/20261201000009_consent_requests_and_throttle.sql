-- Authorization requests the authorization server validated and keeps until the person
-- decides: the consent form carries only the handle, never the request's parameters. Bound to
-- the console session that saw the consent screen, single use, short-lived.
CREATE TABLE oauth_requests (
    id              BIGSERIAL PRIMARY KEY,
    handle          TEXT NOT NULL UNIQUE CHECK (handle LIKE 'areq\_%'),
    session_id      BIGINT NOT NULL REFERENCES console_sessions(id) ON DELETE CASCADE,
    -- The tenant the consent screen was shown for; switching tenants voids it.
    tenant_id       BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    client_id       TEXT NOT NULL,
    redirect_uri    TEXT NOT NULL,
    code_challenge  TEXT NOT NULL,
    state           TEXT,
    resource        TEXT NOT NULL,
    scope           TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at      TIMESTAMPTZ NOT NULL,
    used_at         TIMESTAMPTZ
);

-- Sign-in attempts, counted atomically in the statement that checks them: one row per
-- (account, source address) and one per account (the global ceiling).
CREATE TABLE login_throttle (
    key           TEXT PRIMARY KEY,
    window_start  TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts      INT NOT NULL
);

-- The old per-email failure log is replaced by login_throttle.
DROP TABLE login_failures;

-- A refresh token carries the end of its grant's absolute lifetime: rotation renews the token,
-- never the grant.
ALTER TABLE connection_tokens ADD COLUMN grant_expires_at TIMESTAMPTZ;
-- Grants issued before this had no end: they get the full lifetime from their token's creation.
UPDATE connection_tokens SET grant_expires_at = created_at + interval '90 days' WHERE kind = 'refresh';
