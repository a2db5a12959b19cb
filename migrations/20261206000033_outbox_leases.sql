-- The outbox's dispatcher leases the rows it delivers instead of holding them locked in a
-- transaction while a relay answers: a claim commits at once, marking the rows with a lease
-- (a random token and a deadline); its marks apply only while the token is still the row's;
-- rows of a dispatcher that stopped mid-batch are claimed again once their lease ends.
ALTER TABLE outbox ADD COLUMN lease_token BIGINT, ADD COLUMN lease_until TIMESTAMPTZ;
