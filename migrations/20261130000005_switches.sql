-- The platform-wide kill switch (R18). One row; Postgres is the truth, NATS only pushes it.
CREATE TABLE platform_state (
    singleton    BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    global_kill  BOOLEAN NOT NULL DEFAULT false,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO platform_state DEFAULT VALUES;

-- The per-tenant agent switch; agents are allowed unless a row says otherwise.
ALTER TABLE tenants ADD COLUMN agent_access BOOLEAN NOT NULL DEFAULT true;
