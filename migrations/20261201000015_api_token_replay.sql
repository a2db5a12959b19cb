-- no-transaction
-- A REST call's silent writes replay as an MCP connection's do (R8): the replay cache is kept
-- per API token as well as per connection, exactly one of the two per entry.
--
-- Run as short transactions so writers wait only for catalog changes, never for a scan: the
-- new constraints are added NOT VALID and validated under a lock that lets writes go on. The
-- two partial indexes are built with the table write-locked; replay entries are pruned after a
-- day, so that is a day's writes at most. Every step can run again, so a run stopped half way
-- (a lock timeout) is finished by the next.
BEGIN;
SET LOCAL lock_timeout = '5s';
ALTER TABLE replay_entries
    ALTER COLUMN connection_id DROP NOT NULL,
    ADD COLUMN IF NOT EXISTS api_token_id BIGINT;
ALTER TABLE replay_entries
    DROP CONSTRAINT IF EXISTS replay_entries_api_token_fk,
    DROP CONSTRAINT IF EXISTS replay_entries_one_scope;
ALTER TABLE replay_entries
    ADD CONSTRAINT replay_entries_api_token_fk FOREIGN KEY (api_token_id)
        REFERENCES api_tokens(id) ON DELETE CASCADE NOT VALID,
    ADD CONSTRAINT replay_entries_one_scope
        CHECK (num_nonnulls(connection_id, api_token_id) = 1) NOT VALID;
COMMIT;

BEGIN;
SET LOCAL lock_timeout = '5s';
ALTER TABLE replay_entries VALIDATE CONSTRAINT replay_entries_api_token_fk;
ALTER TABLE replay_entries VALIDATE CONSTRAINT replay_entries_one_scope;
COMMIT;

BEGIN;
SET LOCAL lock_timeout = '5s';
CREATE INDEX IF NOT EXISTS replay_entries_api_lookup_idx
    ON replay_entries (api_token_id, tool, args_digest, created_at DESC)
    WHERE api_token_id IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS replay_entries_api_key_idx
    ON replay_entries (api_token_id, idempotency_key)
    WHERE api_token_id IS NOT NULL AND idempotency_key IS NOT NULL;
COMMIT;
