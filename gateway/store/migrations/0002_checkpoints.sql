-- Signed checkpoints: the sequencer (one gateway, elected by an advisory lock) folds the head of
-- every stream into checkpoint n+1, chained to checkpoint n by `prev` and signed with its key.
-- A stream later found shorter than a checkpoint saw it was cut short (gateway/store/sequencer.py).

CREATE TABLE agw.checkpoint (
    n           bigint PRIMARY KEY CHECK (n > 0),
    hash        text NOT NULL,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TRIGGER checkpoint_append_only BEFORE UPDATE OR DELETE ON agw.checkpoint
    FOR EACH ROW EXECUTE FUNCTION agw.append_only();
CREATE TRIGGER checkpoint_no_truncate BEFORE TRUNCATE ON agw.checkpoint
    FOR EACH STATEMENT EXECUTE FUNCTION agw.append_only();

GRANT SELECT, INSERT ON agw.checkpoint TO agw_gateway;
GRANT SELECT ON agw.checkpoint TO agw_supervisor, agw_reviewer;
