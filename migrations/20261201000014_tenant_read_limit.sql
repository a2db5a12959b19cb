-- Every MCP request reads its tenant's read-bucket override with its connection context. As a
-- lookup in tenant_rate_limits, Postgres scans that table (a few pages, every tenant's overrides)
-- on each request, so the cost grew with the number of tenants that set one. The tenant's row
-- now carries it, kept by a trigger, so every way an override is set or removed (gatehousectl,
-- the console, SQL) is reflected; tenant_rate_limits stays the source of truth.
ALTER TABLE tenants ADD COLUMN read_per_minute INT;

UPDATE tenants t SET read_per_minute = r.per_minute
FROM tenant_rate_limits r
WHERE r.tenant_id = t.id AND r.class = 'read';

CREATE FUNCTION tenant_read_limit() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.class = 'read' THEN
        UPDATE tenants SET read_per_minute = NULL WHERE id = OLD.tenant_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.class = 'read' THEN
        UPDATE tenants SET read_per_minute = NEW.per_minute WHERE id = NEW.tenant_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenant_read_limit AFTER INSERT OR UPDATE OR DELETE ON tenant_rate_limits
    FOR EACH ROW EXECUTE FUNCTION tenant_read_limit();

CREATE FUNCTION tenant_read_limits_truncated() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE tenants SET read_per_minute = NULL WHERE read_per_minute IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenant_read_limits_truncated AFTER TRUNCATE ON tenant_rate_limits
    FOR EACH STATEMENT EXECUTE FUNCTION tenant_read_limits_truncated();
