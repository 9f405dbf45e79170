-- The ledger: one hash chain per gateway process (a stream). A record is the audit record the
-- file log would write (its canonical JSON, `body`), with `stream` and `seq` in it; `hash` is
-- its SHA-256 (gateway/audit/records.py). PRIMARY KEY (stream, seq) refuses any fork.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'agw_gateway') THEN
        CREATE ROLE agw_gateway NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'agw_supervisor') THEN
        CREATE ROLE agw_supervisor NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'agw_reviewer') THEN
        CREATE ROLE agw_reviewer NOLOGIN;
    END IF;
END
$$;

CREATE TABLE agw.stream (
    stream      text PRIMARY KEY,
    n           bigint GENERATED ALWAYS AS IDENTITY UNIQUE,  -- the order streams started in
    host        text NOT NULL,
    pid         integer NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX stream_host ON agw.stream (host, n);

CREATE TABLE agw.record (
    stream      text NOT NULL REFERENCES agw.stream (stream),
    seq         bigint NOT NULL CHECK (seq > 0),
    hash        text NOT NULL,
    body        text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (stream, seq)
);

-- Nobody edits the ledger: a second line behind the grants (a superuser can pass both, which is
-- what `gateway audit verify --store` and the signed checkpoints are for).
CREATE FUNCTION agw.append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'agw.%: the ledger is append-only (% refused)', TG_TABLE_NAME, TG_OP;
END
$$;
CREATE TRIGGER record_append_only BEFORE UPDATE OR DELETE ON agw.record
    FOR EACH ROW EXECUTE FUNCTION agw.append_only();
CREATE TRIGGER record_no_truncate BEFORE TRUNCATE ON agw.record
    FOR EACH STATEMENT EXECUTE FUNCTION agw.append_only();
CREATE TRIGGER stream_append_only BEFORE UPDATE OR DELETE ON agw.stream
    FOR EACH ROW EXECUTE FUNCTION agw.append_only();
CREATE TRIGGER stream_no_truncate BEFORE TRUNCATE ON agw.stream
    FOR EACH STATEMENT EXECUTE FUNCTION agw.append_only();

GRANT USAGE ON SCHEMA agw TO agw_gateway, agw_supervisor, agw_reviewer;
GRANT SELECT, INSERT ON agw.stream, agw.record TO agw_gateway;
GRANT SELECT ON agw.stream, agw.record TO agw_supervisor, agw_reviewer;
