-- Passkeys (WebAuthn) and the proof of the person behind each decision.

-- The WebAuthn user handle: random, so a credential names no email and no serial id.
ALTER TABLE people ADD COLUMN webauthn_id UUID NOT NULL DEFAULT gen_random_uuid();
CREATE UNIQUE INDEX people_webauthn_id_key ON people (webauthn_id);

CREATE TABLE passkeys (
    id             BIGSERIAL PRIMARY KEY,
    handle         TEXT NOT NULL UNIQUE CHECK (handle LIKE 'pky\_%'),
    person_id      BIGINT NOT NULL REFERENCES people(id),
    credential_id  BYTEA NOT NULL UNIQUE,
    name           TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 60),
    -- The library's credential (public key, signature counter, backup flags).
    passkey        JSONB NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used_at   TIMESTAMPTZ
);
CREATE INDEX passkeys_person_idx ON passkeys (person_id);

-- A ceremony in flight: the library's state kept server-side (the browser holds only a random
-- id), used once, for five minutes. A decision's ceremony names the decision it is made for.
CREATE TABLE webauthn_ceremonies (
    id          BIGSERIAL PRIMARY KEY,
    token_hash  BYTEA NOT NULL UNIQUE,
    purpose     TEXT NOT NULL CHECK (purpose IN ('register', 'sign_in', 'decision')),
    person_id   BIGINT REFERENCES people(id) ON DELETE CASCADE,
    decision    TEXT,
    state       JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL,
    used_at     TIMESTAMPTZ,
    CHECK ((purpose = 'decision') = (decision IS NOT NULL))
);
CREATE INDEX webauthn_ceremonies_expires_idx ON webauthn_ceremonies (expires_at);

-- A tenant's policy: every decision that widens what agents can do needs a passkey.
ALTER TABLE tenants ADD COLUMN decisions_need_passkey BOOLEAN NOT NULL DEFAULT false;

-- How a session's person proved themself when it began.
ALTER TABLE console_sessions ADD COLUMN signed_in_with TEXT NOT NULL DEFAULT 'password'
    CHECK (signed_in_with IN ('password', 'passkey', 'sso'));
ALTER TABLE console_sessions ADD COLUMN passkey_id BIGINT REFERENCES passkeys(id) ON DELETE CASCADE;

-- How the person behind an audited decision proved themself: {"method": "passkey",
-- "passkey": "pky_…", "user_verified": true} or the session's own sign-in.
ALTER TABLE audit_log ADD COLUMN proof JSONB;
