-- When Gatehouse last tried to fetch a private_key_jwt client's key set, whether or not it
-- succeeded: a client whose jwks_uri fails is tried again at most once a minute, not on every
-- token request.
ALTER TABLE oauth_clients ADD COLUMN jwks_tried_at timestamptz;
