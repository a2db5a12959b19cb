-- A REST call's silent writes replay as an MCP connection's do (R8): the replay cache is kept
-- per API token as well as per connection, exactly one of the two per entry.
SET lock_timeout = '5s';

ALTER TABLE replay_entries
    ALTER COLUMN connection_id DROP NOT NULL,
    ADD COLUMN api_token_id BIGINT REFERENCES api_tokens(id) ON DELETE CASCADE,
    ADD CONSTRAINT replay_entries_one_scope CHECK (num_nonnulls(connection_id, api_token_id) = 1);

CREATE INDEX replay_entries_api_lookup_idx
    ON replay_entries (api_token_id, tool, args_digest, created_at DESC)
    WHERE api_token_id IS NOT NULL;
CREATE UNIQUE INDEX replay_entries_api_key_idx
    ON replay_entries (api_token_id, idempotency_key)
    WHERE api_token_id IS NOT NULL AND idempotency_key IS NOT NULL;
