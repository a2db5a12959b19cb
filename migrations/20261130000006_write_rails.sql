-- The write rails (R6–R11, R19): pending two-step actions, the replay cache of silent writes,
-- the outbox of customer- and technician-facing effects, alert rules, and the fields the
-- write tools need.

CREATE TABLE pending_actions (
    id             BIGSERIAL PRIMARY KEY,
    tenant_id      BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle         TEXT NOT NULL UNIQUE CHECK (handle LIKE 'pac\_%'),
    connection_id  BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    tool           TEXT NOT NULL,
    -- Normalized arguments (canonical JSON) and their SHA-256.
    args           JSONB NOT NULL,
    args_digest    TEXT NOT NULL,
    -- SHA-256 of exactly what will be sent or changed; re-computed at confirmation.
    content_hash   TEXT NOT NULL,
    summary        TEXT NOT NULL,
    token_hash     BYTEA NOT NULL UNIQUE,
    status         TEXT NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'executed', 'rejected', 'superseded')),
    expires_at     TIMESTAMPTZ NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    decided_at     TIMESTAMPTZ,
    result         JSONB
);
CREATE INDEX pending_actions_connection_idx ON pending_actions (connection_id, created_at);

-- Silent writes already executed, by connection, tool and argument digest (R8). Holds the
-- presenter output that was returned, never a one-time secret.
CREATE TABLE replay_entries (
    id               BIGSERIAL PRIMARY KEY,
    connection_id    BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    tool             TEXT NOT NULL,
    args_digest      TEXT NOT NULL,
    idempotency_key  TEXT,
    result           JSONB NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX replay_entries_lookup_idx ON replay_entries (connection_id, tool, args_digest, created_at DESC);
CREATE UNIQUE INDEX replay_entries_key_idx ON replay_entries (connection_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Messages and pages to deliver. Written in the transaction of the effect; delivered at least
-- once by the dispatcher, deduplicated downstream by the idempotency key.
CREATE TABLE outbox (
    id                 BIGSERIAL PRIMARY KEY,
    tenant_id          BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    pending_action_id  BIGINT REFERENCES pending_actions(id) ON DELETE SET NULL,
    channel            TEXT NOT NULL CHECK (channel IN ('email', 'page')),
    recipient          TEXT NOT NULL,
    subject            TEXT NOT NULL,
    body               TEXT NOT NULL,
    idempotency_key    TEXT NOT NULL UNIQUE,
    status             TEXT NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'sent', 'failed')),
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at            TIMESTAMPTZ
);
CREATE INDEX outbox_queued_idx ON outbox (status, id) WHERE status = 'queued';

CREATE TABLE alert_rules (
    id           BIGSERIAL PRIMARY KEY,
    tenant_id    BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle       TEXT NOT NULL UNIQUE CHECK (handle LIKE 'alr\_%'),
    name         TEXT NOT NULL,
    description  TEXT NOT NULL,
    muted_until  TIMESTAMPTZ,
    muted_by     BIGINT REFERENCES people(id),
    UNIQUE (tenant_id, name)
);

-- Internal booking fields the customer never sees.
ALTER TABLE bookings
    ADD COLUMN priority TEXT NOT NULL DEFAULT 'normal' CHECK (priority IN ('low', 'normal', 'high')),
    ADD COLUMN reference TEXT,
    ADD COLUMN separate_reason TEXT;

-- Why a customer was created although another had the same email or phone (R9).
ALTER TABLE customers ADD COLUMN separate_reason TEXT;
CREATE INDEX customers_tenant_phone_idx ON customers (tenant_id, regexp_replace(coalesce(phone, ''), '[^0-9+]', '', 'g'));

-- Audit rows of two-step actions point at their pending action; previews and rejections are
-- outcomes of their own.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_outcome_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_outcome_check
    CHECK (outcome IN ('ok', 'refused', 'failed', 'previewed', 'rejected'));
ALTER TABLE audit_log ADD COLUMN pending_action_id BIGINT REFERENCES pending_actions(id) ON DELETE SET NULL;
