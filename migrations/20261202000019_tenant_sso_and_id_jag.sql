-- Tenant single sign-on (OpenID Connect) and enterprise-managed authorization (ID-JAG).

-- A tenant's identity provider. An issuer serves one tenant only (UNIQUE): an ID token or an
-- ID-JAG names its issuer, and the issuer alone must tell which tenant it speaks for.
CREATE TABLE tenant_idps (
    id                      BIGSERIAL PRIMARY KEY,
    tenant_id               BIGINT NOT NULL UNIQUE REFERENCES tenants(id) ON DELETE CASCADE,
    issuer                  TEXT NOT NULL UNIQUE,
    client_id               TEXT NOT NULL,
    -- The client secret, sealed (AEAD, shared::seal) with the deployment's secret keys.
    client_secret_sealed    TEXT NOT NULL,
    -- From the issuer's discovery document, checked when the IdP is set.
    authorization_endpoint  TEXT NOT NULL,
    token_endpoint          TEXT NOT NULL,
    jwks_uri                TEXT NOT NULL,
    -- client_secret_basic or client_secret_post, as the discovery document allows.
    token_auth_method       TEXT NOT NULL CHECK (token_auth_method IN ('client_secret_basic', 'client_secret_post')),
    -- The email domains the IdP vouches for: a first sign-in links a member by a verified
    -- email of these domains only.
    email_domains           TEXT[] NOT NULL DEFAULT '{}',
    -- A verified person of those domains who is not a member joins with the lowest role.
    allow_join              BOOLEAN NOT NULL DEFAULT false,
    -- Password sessions cannot enter the tenant.
    sso_required            BOOLEAN NOT NULL DEFAULT false,
    -- The tenant accepts ID-JAGs this IdP signs (enterprise-managed authorization).
    id_jag                  BOOLEAN NOT NULL DEFAULT false,
    -- How long a console session started by the IdP lives.
    session_hours           INT NOT NULL DEFAULT 8 CHECK (session_hours BETWEEN 1 AND 12),
    jwks                    JSONB,
    jwks_fetched_at         TIMESTAMPTZ,
    jwks_tried_at           TIMESTAMPTZ,
    created_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at              TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Who a person is at an IdP: linked by (issuer, subject), never by email alone. The link
-- stays when the tenant removes its IdP, so another tenant taking the issuer later cannot
-- take over these people.
CREATE TABLE person_identities (
    id          BIGSERIAL PRIMARY KEY,
    issuer      TEXT NOT NULL,
    subject     TEXT NOT NULL,
    person_id   BIGINT NOT NULL REFERENCES people(id) ON DELETE CASCADE,
    tenant_id   BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (issuer, subject)
);
CREATE INDEX person_identities_person_idx ON person_identities (person_id);

-- A sign-in sent to the IdP and not yet back: state (hashed), nonce and PKCE verifier, used once.
CREATE TABLE sso_sign_ins (
    id             BIGSERIAL PRIMARY KEY,
    state_hash     BYTEA NOT NULL UNIQUE,
    tenant_id      BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    idp_id         BIGINT NOT NULL REFERENCES tenant_idps(id) ON DELETE CASCADE,
    nonce          TEXT NOT NULL,
    pkce_verifier  TEXT NOT NULL,
    next           TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at     TIMESTAMPTZ NOT NULL,
    consumed_at    TIMESTAMPTZ
);

-- jtis of JWTs an IdP signed (ID-JAGs, logout tokens), each kept until its JWT expires.
CREATE TABLE idp_jtis (
    issuer      TEXT NOT NULL,
    jti         TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (issuer, jti)
);

-- A console session started by the tenant's IdP: which IdP, and its session id (`sid`) for
-- back-channel logout. Removing the IdP ends these sessions.
ALTER TABLE console_sessions
    ADD COLUMN idp_id BIGINT REFERENCES tenant_idps(id) ON DELETE CASCADE,
    ADD COLUMN idp_sid TEXT;
CREATE INDEX console_sessions_idp_idx ON console_sessions (idp_id) WHERE idp_id IS NOT NULL;

-- A connection whose grant came from the tenant's IdP (an ID-JAG) rather than a person's consent.
ALTER TABLE connections ADD COLUMN granted_by TEXT CHECK (granted_by IN ('idp'));

-- Confidential clients a tenant admin registers for ID-JAG (client_secret_basic or _post):
-- the secret is kept as a hash, the tenant that registered it is the only one it serves.
ALTER TABLE oauth_clients
    ADD COLUMN client_secret_hash BYTEA,
    ADD COLUMN tenant_id BIGINT REFERENCES tenants(id) ON DELETE CASCADE;
ALTER TABLE oauth_clients DROP CONSTRAINT oauth_clients_kind_check,
    ADD CONSTRAINT oauth_clients_kind_check CHECK (kind IN ('registered', 'metadata_document', 'confidential'));
ALTER TABLE oauth_clients DROP CONSTRAINT oauth_clients_token_endpoint_auth_method_check,
    ADD CONSTRAINT oauth_clients_token_endpoint_auth_method_check
    CHECK (token_endpoint_auth_method IN ('none', 'private_key_jwt', 'client_secret'));
ALTER TABLE oauth_clients ADD CONSTRAINT oauth_clients_confidential_check
    CHECK ((kind = 'confidential') = (client_secret_hash IS NOT NULL AND tenant_id IS NOT NULL));
