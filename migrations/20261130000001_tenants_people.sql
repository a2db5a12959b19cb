-- Tenants, people and their memberships. A person may belong to several tenants;
-- the role of a membership decides the person's current rights there (see shared::rights).
CREATE TABLE tenants (
    id          BIGSERIAL PRIMARY KEY,
    handle      TEXT NOT NULL UNIQUE CHECK (handle LIKE 'ten\_%'),
    slug        TEXT NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{1,62}$'),
    name        TEXT NOT NULL,
    currency    CHAR(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    zone        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE people (
    id             BIGSERIAL PRIMARY KEY,
    handle         TEXT NOT NULL UNIQUE CHECK (handle LIKE 'per\_%'),
    email          TEXT NOT NULL,
    name           TEXT NOT NULL,
    password_hash  TEXT,
    active         BOOLEAN NOT NULL DEFAULT true,
    is_operator    BOOLEAN NOT NULL DEFAULT false,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX people_email_key ON people (lower(email));

CREATE TABLE memberships (
    tenant_id   BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    person_id   BIGINT NOT NULL REFERENCES people(id) ON DELETE CASCADE,
    role        TEXT NOT NULL CHECK (role IN ('admin', 'dispatcher', 'viewer')),
    active      BOOLEAN NOT NULL DEFAULT true,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, person_id)
);
CREATE INDEX memberships_person_idx ON memberships (person_id);
