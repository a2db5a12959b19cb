-- API tokens end: every token has an expiry (chosen at creation, 90 days by default), and a
-- revocation keeps its reason. Tokens issued before this get 90 days from their creation.
ALTER TABLE api_tokens ADD COLUMN expires_at TIMESTAMPTZ;
UPDATE api_tokens SET expires_at = created_at + interval '90 days';
ALTER TABLE api_tokens ALTER COLUMN expires_at SET NOT NULL;
ALTER TABLE api_tokens ADD COLUMN revoke_reason TEXT;
CREATE INDEX api_tokens_tenant_idx ON api_tokens (tenant_id, created_at DESC);

-- Clients whose metadata document asks for it authenticate at the token endpoint with a JWT
-- signed by a key of their published key set (private_key_jwt, RFC 7523); the key set is
-- fetched behind the same SSRF guard as the document and cached.
ALTER TABLE oauth_clients ADD COLUMN token_endpoint_auth_method TEXT NOT NULL DEFAULT 'none'
    CHECK (token_endpoint_auth_method IN ('none', 'private_key_jwt'));
ALTER TABLE oauth_clients ADD COLUMN jwks_uri TEXT;
ALTER TABLE oauth_clients ADD COLUMN jwks JSONB;
ALTER TABLE oauth_clients ADD COLUMN jwks_fetched_at TIMESTAMPTZ;

-- A client assertion is used once: its jti is kept until the assertion expires.
CREATE TABLE oauth_client_assertions (
    client_id   TEXT NOT NULL,
    jti         TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (client_id, jti)
);

