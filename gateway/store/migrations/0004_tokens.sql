-- Bearer tokens of the fleet (agents', supervisors' console secrets, scrapers'): digests only, as
-- in the tokens file (gateway/server/tokens.py). A token may be limited to hosts. Revoking sets
-- revoked_at (the row stays, for the record); every gateway stops honouring it within its cache's
-- refresh (gateway/store/tokens.py).

CREATE TABLE agw.token (
    id          text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('agent', 'supervisor', 'metrics')),
    principal   text NOT NULL,
    sha256      text NOT NULL UNIQUE,
    label       text NOT NULL DEFAULT '',
    hosts       text[],
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by  text NOT NULL DEFAULT session_user,
    revoked_at  timestamptz,
    revoked_by  text
);

GRANT SELECT ON agw.token TO agw_gateway;
GRANT SELECT, INSERT ON agw.token TO agw_supervisor;
GRANT UPDATE (revoked_at, revoked_by) ON agw.token TO agw_supervisor;
