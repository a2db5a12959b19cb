-- Invitations: a tenant admin invites someone by email with a role; the email carries a link
-- whose token is stored only as its SHA-256. Accepted once (by setting a password, with a
-- passkey, by signing in to an account that exists, or through the tenant's single sign-on),
-- revoked, or left to expire; every step is audited.
CREATE TABLE invitations (
    id           BIGSERIAL PRIMARY KEY,
    handle       TEXT NOT NULL UNIQUE CHECK (handle LIKE 'inv\_%'),
    tenant_id    BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    email        TEXT NOT NULL,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('admin', 'dispatcher', 'viewer')),
    token_hash   BYTEA NOT NULL UNIQUE,
    invited_by   BIGINT REFERENCES people(id) ON DELETE SET NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL,
    accepted_at  TIMESTAMPTZ,
    accepted_how TEXT CHECK (accepted_how IN ('password', 'passkey', 'account', 'sso')),
    person_id    BIGINT REFERENCES people(id) ON DELETE SET NULL,
    revoked_at   TIMESTAMPTZ,
    CHECK ((accepted_at IS NULL) = (accepted_how IS NULL))
);
-- One open invitation per address and tenant (an expired one is closed before a new one).
CREATE UNIQUE INDEX invitations_open_idx ON invitations (tenant_id, lower(email))
    WHERE accepted_at IS NULL AND revoked_at IS NULL;
CREATE INDEX invitations_tenant_idx ON invitations (tenant_id, created_at DESC);

-- The messages list pages newest first per tenant.
CREATE INDEX outbox_tenant_idx ON outbox (tenant_id, id DESC);

-- The passkey a new person joins with is made before the person exists: its ceremony has a
-- purpose of its own, so no other ceremony can be taken for it, nor it for another.
ALTER TABLE webauthn_ceremonies DROP CONSTRAINT webauthn_ceremonies_purpose_check;
ALTER TABLE webauthn_ceremonies ADD CONSTRAINT webauthn_ceremonies_purpose_check
    CHECK (purpose IN ('register', 'sign_in', 'decision', 'invitation'));
