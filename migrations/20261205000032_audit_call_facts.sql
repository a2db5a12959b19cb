-- What a policy simulation needs of an agent's audited call beyond its row: the non-secret
-- facts of its arguments (handles, times, zones, numbers, choices; never free text, contact
-- details, search words or opaque tokens), so a draft rule over `context.args` replays as it
-- would have judged. Kept apart from the hash-chained audit row: they are a simulation's input,
-- not evidence, and they go after 91 days (the longest window a simulation replays is 90).
-- `audit_id` names its audit row without a foreign key: the log is append-only and its guard
-- (which also refuses TRUNCATE) must stay the only thing standing between a statement and it.
CREATE TABLE audit_call_facts (
    audit_id   BIGINT PRIMARY KEY,
    tenant_id  BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    facts      JSONB NOT NULL CHECK (jsonb_typeof(facts) = 'object' AND octet_length(facts::text) <= 16384)
);
CREATE INDEX audit_call_facts_at_idx ON audit_call_facts (at);
