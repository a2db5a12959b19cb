-- Where the work is and who may do it, and the customer's own clock, so a tenant's policies can
-- say "moves only to a technician of the booking's region" and "no message to a customer at
-- night in the customer's zone". A booking's region is its customer's. Both are optional: a
-- record without one has no such attribute to a policy (`resource has region`). A customer's
-- zone is an IANA name; without one the tenant's zone stands for it.
ALTER TABLE customers
    ADD COLUMN region TEXT CHECK (region IS NULL OR length(region) BETWEEN 1 AND 64),
    ADD COLUMN zone   TEXT CHECK (zone IS NULL OR length(zone) BETWEEN 1 AND 64);
ALTER TABLE technicians
    ADD COLUMN region TEXT CHECK (region IS NULL OR length(region) BETWEEN 1 AND 64);
