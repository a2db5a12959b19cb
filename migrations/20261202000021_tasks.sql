-- Tasks (MCP extension io.modelcontextprotocol/tasks, SEP-2663): a slow tool's call answered at
-- once with a task, run on the worker that accepted it, read by tasks/get on any worker.
-- A task belongs to the connection (and tenant) that created it; every read and cancel filters
-- by both. Results are bounded by the service (1 MiB) and the row expires with the task's TTL
-- (housekeeping deletes it). A working task whose worker stops heartbeating is failed.
CREATE TABLE tasks (
    id              BIGSERIAL PRIMARY KEY,
    handle          TEXT NOT NULL UNIQUE CHECK (handle LIKE 'tsk\_%'),
    tenant_id       BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    connection_id   BIGINT NOT NULL REFERENCES connections(id) ON DELETE CASCADE,
    tool            TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'working'
                    CHECK (status IN ('working', 'completed', 'failed', 'cancelled')),
    status_message  TEXT,
    -- The tool's CallToolResult (completed) or the JSON-RPC error (failed); never both.
    result          JSONB,
    error           JSONB,
    worker          TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at      TIMESTAMPTZ NOT NULL,
    CHECK (result IS NULL OR error IS NULL)
);
CREATE INDEX tasks_connection ON tasks (connection_id, status);
CREATE INDEX tasks_expires ON tasks (expires_at);
CREATE INDEX tasks_working_heartbeat ON tasks (heartbeat_at) WHERE status = 'working';
