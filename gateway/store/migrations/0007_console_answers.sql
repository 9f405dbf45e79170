-- Answers given in a gateway's web console (gateway/server/console/fleet.py). The console runs
-- inside a gateway, connected as the gateway's login, which may not answer (0003). So the
-- supervisor's authority travels with the answer: the console passes on the supervisor's own
-- console secret (`gateway token create --supervisor NAME --store`), and the database checks it
-- here, against agw.token, before anything changes. A stolen gateway login alone still answers
-- nothing: the table holds only the secrets' digests, and this function wants the secret itself.
-- answered_by is the secret's supervisor; answered_from names the console's host, the secret's
-- id and the login that carried it. Exactly one answer wins, as for agw.answer(): both go
-- through agw.answer_as(), which only the schema's owner may call directly.

CREATE FUNCTION agw.answer_as(p_by text, p_call_id text, p_approve boolean, p_digest text, p_reason text,
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
           scope = p_scope, answered_by = p_by, answered_from = p_from,
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
REVOKE ALL ON FUNCTION agw.answer_as(text, text, boolean, text, text, text, text) FROM PUBLIC;

-- a supervisor's database login answers as itself (unchanged behaviour, now through answer_as)
CREATE OR REPLACE FUNCTION agw.answer(p_call_id text, p_approve boolean, p_digest text, p_reason text,
                                      p_scope text, p_from text)
RETURNS agw.approval
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, agw AS $$
    SELECT * FROM agw.answer_as(session_user, p_call_id, p_approve, p_digest, p_reason, p_scope, p_from);
$$;

CREATE FUNCTION agw.answer_with_secret(p_secret text, p_host text, p_call_id text, p_approve boolean,
                                       p_digest text, p_reason text, p_scope text, p_from text)
RETURNS agw.approval
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, agw AS $$
DECLARE
    t agw.token;
BEGIN
    SELECT * INTO t FROM agw.token
     WHERE sha256 = encode(sha256(convert_to(p_secret, 'UTF8')), 'hex') AND kind = 'supervisor';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'not a supervisor''s secret of this fleet: nothing was answered';
    ELSIF t.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'the supervisor''s secret % was revoked (by %): nothing was answered', t.id, t.revoked_by;
    ELSIF t.hosts IS NOT NULL AND NOT (p_host = ANY (t.hosts)) THEN
        RAISE EXCEPTION 'the supervisor''s secret % is not honoured on %: nothing was answered', t.id, p_host;
    END IF;
    RETURN agw.answer_as(t.principal, p_call_id, p_approve, p_digest, p_reason, p_scope,
                         format('%s (console; secret %s; through login %s)', p_from, t.id, session_user));
END
$$;
REVOKE ALL ON FUNCTION agw.answer_with_secret(text, text, text, boolean, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agw.answer_with_secret(text, text, text, boolean, text, text, text, text)
    TO agw_gateway, agw_supervisor;

-- every role reads the schema's versions: a gateway connected as its own login checks them at
-- start (db.require_current), and before this it could not (only the owner could read them)
GRANT SELECT ON agw.migration TO agw_gateway, agw_supervisor, agw_reviewer;
