-- Policy revisions: a signed bundle of a policy's files (the file and its includes), published
-- once its checks passed (`gateway policy publish --store`). Gateways verify the signature with
-- keys pinned in their own configuration (never read from here), then load it as they load a
-- file (compile, examples, tests; a failure keeps the policy in force), and report what they run.

CREATE TABLE agw.policy_revision (
    rev           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sha256        text NOT NULL,
    bundle        text NOT NULL,
    key           text NOT NULL,
    sig           text NOT NULL,
    published_by  text NOT NULL DEFAULT session_user,
    published_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TRIGGER policy_revision_append_only BEFORE UPDATE OR DELETE ON agw.policy_revision
    FOR EACH ROW EXECUTE FUNCTION agw.append_only();

CREATE TABLE agw.policy_status (
    stream      text PRIMARY KEY,
    host        text NOT NULL,
    rev         bigint,
    state       text NOT NULL,
    error       text,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);

GRANT SELECT ON agw.policy_revision TO agw_gateway, agw_reviewer;
GRANT SELECT, INSERT ON agw.policy_revision TO agw_supervisor;
GRANT SELECT, INSERT, UPDATE ON agw.policy_status TO agw_gateway;
GRANT SELECT ON agw.policy_status TO agw_supervisor, agw_reviewer;
