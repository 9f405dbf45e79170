-- A gateway that died (kill -9, a crash) leaves its asks pending: the host's next gateway expires
-- them, with the reason, when it marks that stream's calls interrupted (gateway/store/ledger.py).
-- Only pending requests of the named stream, only as `expired`; an answer that won stands.

CREATE FUNCTION agw.abandon(p_stream text, p_reason text)
RETURNS SETOF agw.approval
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, agw AS $$
BEGIN
    RETURN QUERY
    UPDATE agw.approval SET state = 'expired', answered_at = clock_timestamp(), reason = p_reason
     WHERE stream = p_stream AND state = 'pending'
    RETURNING *;
END
$$;

REVOKE ALL ON FUNCTION agw.abandon(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agw.abandon(text, text) TO agw_gateway;
