-- A tamper-evident audit log (R19) and its delivery to a tenant's SIEM.
--
-- 1. Nothing of the product updates or deletes audit rows, and the schema cannot do it behind
--    its back: the cascades and set-nulls onto audit_log go (its ids stay as plain values, a
--    record of what was), and a trigger refuses UPDATE, DELETE and TRUNCATE. The one
--    exception is retention (`gatehousectl audit prune`), which sets
--    `gatehouse.audit_retention = 'on'` in its own transaction to delete rows a signed
--    checkpoint already covers.
-- 2. The hash chain lives beside the log (audit_chain): the control plane chains each
--    tenant's new rows, in the order it sees them commit, shortly after; the write path stays
--    one INSERT (a trigger queues the row for the chainer).
-- 3. Signed checkpoints of each tenant's chain head (Ed25519).
-- 4. The tenant's SIEM webhook and its delivery cursor.

ALTER TABLE audit_log DROP CONSTRAINT IF EXISTS audit_log_tenant_id_fkey;
ALTER TABLE audit_log DROP CONSTRAINT IF EXISTS audit_log_connection_id_fkey;
ALTER TABLE audit_log DROP CONSTRAINT IF EXISTS audit_log_pending_action_id_fkey;

CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('gatehouse.audit_retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();

-- One link per chained row: its place in the tenant's chain, the previous row's hash and its
-- own, SHA-256(prev_hash || canonical content) (docs/operations.md, "Verifying the audit log").
CREATE TABLE audit_chain (
    audit_id    BIGINT PRIMARY KEY,
    tenant_id   BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    prev_hash   BYTEA NOT NULL,
    hash        BYTEA NOT NULL,
    chained_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, seq)
);
CREATE TRIGGER audit_chain_append_only BEFORE UPDATE OR DELETE ON audit_chain
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_chain_no_truncate BEFORE TRUNCATE ON audit_chain
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();

-- The rows still to chain: written by a trigger in the statement that inserts the audit row,
-- so the write path stays one INSERT with no extra round trip. A row inserted with the trigger
-- off never reaches the chain, and verification names it as inserted.
CREATE TABLE audit_unchained (
    audit_id   BIGINT PRIMARY KEY,
    tenant_id  BIGINT NOT NULL
);
CREATE INDEX audit_unchained_tenant_idx ON audit_unchained (tenant_id, audit_id);
CREATE FUNCTION audit_queue_for_chain() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit_unchained (audit_id, tenant_id) VALUES (NEW.id, NEW.tenant_id);
    RETURN NULL;
END
$$;
CREATE TRIGGER audit_log_queue_for_chain AFTER INSERT ON audit_log
    FOR EACH ROW WHEN (NEW.tenant_id IS NOT NULL) EXECUTE FUNCTION audit_queue_for_chain();
INSERT INTO audit_unchained (audit_id, tenant_id)
    SELECT id, tenant_id FROM audit_log WHERE tenant_id IS NOT NULL;

-- Where each tenant's chain ends (the chainer's working pointer; verification never trusts it).
CREATE TABLE audit_chain_heads (
    tenant_id   BIGINT PRIMARY KEY,
    seq         BIGINT NOT NULL,
    hash        BYTEA NOT NULL,
    chained_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE audit_checkpoints (
    id          BIGSERIAL PRIMARY KEY,
    tenant_id   BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    head_hash   BYTEA NOT NULL,
    signed_at   TIMESTAMPTZ NOT NULL,
    kid         TEXT NOT NULL,
    signature   BYTEA NOT NULL,
    UNIQUE (tenant_id, seq)
);
CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();

-- The tenant's SIEM webhook: one per tenant, its secret sealed (GATEHOUSE_SECRET_KEYS), the
-- previous one kept for a day after a rotation (both sign meanwhile), and the delivery cursor.
CREATE TABLE audit_webhooks (
    tenant_id          BIGINT PRIMARY KEY REFERENCES tenants(id) ON DELETE CASCADE,
    url                TEXT NOT NULL,
    secret_sealed      TEXT NOT NULL,
    previous_sealed    TEXT,
    previous_until     TIMESTAMPTZ,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    rotated_at         TIMESTAMPTZ,
    delivered_seq      BIGINT NOT NULL,
    attempts           INT NOT NULL DEFAULT 0,
    next_attempt_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error         TEXT,
    last_delivered_at  TIMESTAMPTZ,
    dropped_events     BIGINT NOT NULL DEFAULT 0,
    dropped_note       TEXT
);
