-- One time says when an outbox message may next be attempted: while it is leased, when its
-- lease ends; after a failed attempt, when its pause does; otherwise now. The dispatcher's
-- claim reads only the messages that are due, in that order, through an index of them, so a
-- backlog waiting out its pauses (a relay down for an hour) costs a claim nothing.
ALTER TABLE outbox RENAME COLUMN lease_until TO due_at;
UPDATE outbox SET due_at = now() WHERE due_at IS NULL AND status = 'queued';
ALTER TABLE outbox ALTER COLUMN due_at SET DEFAULT now();
CREATE INDEX outbox_due_idx ON outbox (due_at, id) WHERE status = 'queued';
