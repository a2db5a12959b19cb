-- Checkpoints that survive the database's owner (docs/architecture.md, "The audit log's
-- proof").
--
-- 1. Chain version 2: links written from now on hash the row's RFC 8785 (JCS) canonical form,
--    which names the tenant, the actor, the connection and the pending action by their public
--    handles and includes the link's own position, so a link agrees with its row (row,
--    tenant, seq). Links of version 1 keep verifying with the version 1 form.
-- 2. Checkpoints of version 2 commit to the previous checkpoint (its position and digest), so
--    a missing or replaced checkpoint is named; the digest of each is kept to chain the next.
-- 3. Each tenant's webhook also delivers its checkpoints, in order, after the events they
--    cover (a cursor of its own), and a delivery holds a lease instead of a transaction, so no
--    transaction stays open across an HTTP call.

ALTER TABLE audit_chain ADD COLUMN v SMALLINT NOT NULL DEFAULT 1 CHECK (v IN (1, 2));
ALTER TABLE audit_chain ALTER COLUMN v SET DEFAULT 2;

ALTER TABLE audit_checkpoints
    ADD COLUMN v SMALLINT NOT NULL DEFAULT 1 CHECK (v IN (1, 2)),
    ADD COLUMN prev_seq BIGINT,
    ADD COLUMN prev_digest BYTEA,
    ADD COLUMN digest BYTEA;

ALTER TABLE audit_webhooks
    ADD COLUMN delivered_checkpoint_seq BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN lease_token TEXT,
    ADD COLUMN lease_until TIMESTAMPTZ,
    ADD COLUMN failing_since TIMESTAMPTZ;
UPDATE audit_webhooks w SET delivered_checkpoint_seq =
    coalesce((SELECT max(seq) FROM audit_checkpoints c WHERE c.tenant_id = w.tenant_id), 0);

-- Chaining lag for operators: the oldest row still waiting.
ALTER TABLE audit_unchained ADD COLUMN queued_at TIMESTAMPTZ NOT NULL DEFAULT now();
