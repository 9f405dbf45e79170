"""What an audit record is about, on one line, escaped: the summary `gateway audit` prints for
each record and the console shows beside it."""

from __future__ import annotations

import json
from typing import Any

from gateway.escaping import escaped


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def describe_record(r: dict[str, Any]) -> str:
    """What a record is about, escaped, on one line."""
    data = _mapping(r.get("data"))
    args = _mapping(r.get("arguments"))
    event = r.get("event")

    def compact(value: Any) -> str:
        return escaped(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))

    if event == "decision":
        if isinstance(args.get("command"), str):
            what = escaped(args["command"])
            if args.get("action") not in (None, "run", "start", "send"):
                what = f"{escaped(str(args['action']))}: {what}"
        else:
            what = compact(args) if args else "-"
        reasons = r.get("reasons") if isinstance(r.get("reasons"), list) else []
        if r.get("decision") != "allow" and reasons and isinstance(reasons[0], dict):
            what += f"   (why: {escaped(str(reasons[0].get('message', '')))})"
        return what
    if event == "approval":
        who = f"by {escaped(str(data.get('by')))} ({escaped(str(data.get('how')))})" if data.get("answered") else \
            f"unanswered ({escaped(str(data.get('how')))})"  # fmt: skip
        voided = [k for k in ("bound", "policy_unchanged", "env_unchanged") if data.get(k) is False]
        why = f": {escaped(str(data['reason']))}" if data.get("reason") else ""
        return who + why + (f"   (void: {', '.join(voided)})" if voided else "")
    if event == "approval_withdrawn":
        return escaped(str(data.get("why", "")))
    if event == "result":
        err = _mapping(data.get("error"))
        status = escaped(str(data.get("status", "-")))
        if err:
            return f"{status} {escaped(str(err.get('code')))}: {escaped(str(err.get('message', '')))}"
        code = f" exit {data['exit_code']}" if "exit_code" in data else ""
        return status + code
    if event == "policy_rejected":
        return f"{escaped(str(data.get('error', '')))}   (kept {escaped(str(data.get('kept', '')))[:16]})"
    return compact(data) if data else "-"
