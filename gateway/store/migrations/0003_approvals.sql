-- Approvals as rows. A gateway inserts a request (and NOTIFYs agw_approval_requested); a
-- supervisor answers through agw.answer(), as themselves (session_user), which NOTIFYs
-- agw_approval_answered; the waiting gateway wakes on LISTEN and reads the row. Exactly one
-- answer wins: the first UPDATE of a pending, unexpired row whose digest is the one the
-- supervisor was shown. Gateways cannot answer (no UPDATE, no EXECUTE on answer()); they settle
-- their own request as expired or withdrawn through agw.settle(), which loses to an answer
-- that committed first.

CREATE TABLE agw.approval (
    call_id        text PRIMARY KEY,
    stream         text NOT NULL,
    host           text NOT NULL,
    principal      text NOT NULL,
    request        jsonb NOT NULL,
    digest         text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at     timestamptz NOT NULL,
    state          text NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'approved', 'denied', 'expired', 'withdrawn')),
    scope          text NOT NULL DEFAULT 'once' CHECK (scope IN ('once', 'session')),
    answered_by    text,
    answered_from  text,
    answered_at    timestamptz,
    reason         text
);
CREATE INDEX approval_pending ON agw.approval (created_at) WHERE state = 'pending';

CREATE FUNCTION agw.answer(p_call_id text, p_approve boolean, p_digest text, p_reason text,
                           p_scope text, p_from text)
RETURNS agw.approval
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, agw AS $$
DECLARE
    r agw.approval;
BEGIN
    IF p_scope = 'session' AND NOT p_approve THEN
        RAISE EXCEPTION 'scope session is for approvals: a denial is for this call only';
    END IF;
    UPDATE agw.approval
       SET state = CASE WHEN p_approve THEN 'approved' ELSE 'denied' END,
           scope = p_scope, answered_by = session_user, answered_from = p_from,
           answered_at = clock_timestamp(), reason = p_reason
     WHERE call_id = p_call_id AND state = 'pending' AND expires_at > clock_timestamp()
       AND digest = p_digest
    RETURNING * INTO r;
    IF FOUND THEN
        PERFORM pg_notify('agw_approval_answered', p_call_id);
        RETURN r;
    END IF;
    SELECT * INTO r FROM agw.approval WHERE call_id = p_call_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no pending request %', p_call_id;
    ELSIF r.state IN ('approved', 'denied') THEN
        RAISE EXCEPTION 'request % already has an answer (% by %)', p_call_id, r.state, r.answered_by;
    ELSIF r.state <> 'pending' THEN
        RAISE EXCEPTION 'request % was %: nothing would run', p_call_id, r.state;
    ELSIF r.digest <> p_digest THEN
        RAISE EXCEPTION 'request % is not the call you were shown (its digest differs)', p_call_id;
    END IF;
    RAISE EXCEPTION 'request % has expired', p_call_id;
END
$$;

CREATE FUNCTION agw.settle(p_call_id text, p_state text)
RETURNS agw.approval
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, agw AS $$
DECLARE
    r agw.approval;
BEGIN
    IF p_state NOT IN ('expired', 'withdrawn') THEN
        RAISE EXCEPTION 'a gateway settles its request only as expired or withdrawn, not %', p_state;
    END IF;
    UPDATE agw.approval SET state = p_state, answered_at = clock_timestamp()
     WHERE call_id = p_call_id AND state = 'pending'
    RETURNING * INTO r;
    IF NOT FOUND THEN
        SELECT * INTO r FROM agw.approval WHERE call_id = p_call_id;
    END IF;
    RETURN r;
END
$$;

REVOKE ALL ON FUNCTION agw.answer(text, boolean, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION agw.settle(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agw.answer(text, boolean, text, text, text, text) TO agw_supervisor;
GRANT EXECUTE ON FUNCTION agw.settle(text, text) TO agw_gateway;
GRANT SELECT ON agw.approval TO agw_gateway;
GRANT INSERT (call_id, stream, host, principal, request, digest, expires_at) ON agw.approval TO agw_gateway;
GRANT SELECT ON agw.approval TO agw_supervisor, agw_reviewer;
