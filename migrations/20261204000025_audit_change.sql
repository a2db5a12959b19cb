-- What a settings change changed, from what to what (`{"field": {"from": …, "to": …}}`), kept
-- on its audit row so the console and the export show it. Chain version 2 covers it: the
-- canonical form names it when it is present and omits it when it is not, so every link
-- written before keeps verifying unchanged.
ALTER TABLE audit_log ADD COLUMN change JSONB;
