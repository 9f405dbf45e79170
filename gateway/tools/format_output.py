"""The `format_output` tool: a message, table or JSON document formatted for a human, with ANSI
colours. It runs nothing and touches no file; it is audited like every call."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gateway.calls import FormatOutputCall
from gateway.decision import Decision, Reason, Verdict
from gateway.pipeline import Gated, error

if TYPE_CHECKING:
    from gateway.pipeline import Gateway

STYLES = {  # kind: (symbol, SGR code)
    "success": ("✔", "32"),
    "error": ("✖", "31"),
    "warning": ("⚠", "33"),
    "info": ("\u2139", "36"),
}
BOLD = "1"


def _sgr(code: str, text: str, color: bool, used: set[str]) -> str:
    if not color:
        return text
    used.add(code)
    return f"\x1b[{code}m{text}\x1b[0m"


def _document(call: FormatOutputCall) -> Any:
    """json: `data`, else `message` (parsed when it is a JSON text, else the string itself)."""
    if call.data is not None:
        return call.data
    if call.message is None:
        raise ValueError("data or message: required for kind 'json'")
    try:
        return json.loads(call.message)
    except ValueError:
        return call.message
    except RecursionError:  # `[[[[...` 100,000 deep: a failure of the input, not of the gateway
        raise ValueError("message: the JSON text nests too deeply to be formatted") from None


def render(call: FormatOutputCall) -> tuple[str, list[str]]:
    """The formatted text and the SGR codes it used. Raises ValueError on unusable data."""
    used: set[str] = set()
    if call.kind in STYLES:
        if call.message is None:
            raise ValueError(f"message: required for kind {call.kind!r}")
        symbol, code = STYLES[call.kind]
        return _sgr(code, f"{symbol} {call.message}", call.color, used), sorted(used)
    if call.kind == "json":
        try:
            return json.dumps(_document(call), indent=2, ensure_ascii=False, sort_keys=True), []
        except RecursionError:
            raise ValueError("data: the document nests too deeply to be formatted") from None
    rows = call.data
    if not isinstance(rows, list) or not rows:
        raise ValueError("data: a table needs a non-empty list of objects, or of lists (the first one the header)")
    if all(isinstance(r, dict) for r in rows):
        header = list(dict.fromkeys(k for r in rows for k in r))
        body = [[r.get(k, "") for k in header] for r in rows]
    elif all(isinstance(r, list) for r in rows):
        header, body = rows[0], rows[1:]
    else:
        raise ValueError("data: every row must be an object, or every row a list")
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in body]]
    width = [max(len(r[i]) if i < len(r) else 0 for r in cells) for i in range(len(cells[0]))]
    lines = []
    for n, row in enumerate(cells):
        text = "  ".join(c.ljust(width[i]) for i, c in enumerate(row[: len(width)])).rstrip()
        lines.append(_sgr(BOLD, text, call.color, used) if n == 0 else text)
        if n == 0:
            lines.append("  ".join("-" * w for w in width))
    return "\n".join(lines), sorted(used)


def handle(gw: Gateway, call: FormatOutputCall, call_id: str) -> dict[str, Any]:
    # no policy family decides it (it runs nothing), but like every call it is recorded first
    policy = gw.policy
    nothing = Decision(Verdict.ALLOW, None, (Reason("tool", "runs_nothing", "formats text; runs nothing"),))
    arguments = call.model_dump(exclude={"tool", "principal"}, exclude_none=True)
    base = gw.authorize(
        call_id, call.principal, "format_output", "format_output", policy.workspace, {}, nothing, arguments, policy
    )
    if not isinstance(base, Gated):
        return base
    try:
        text, codes = render(call)
        out: dict[str, Any] = {"status": "ok", "text": text, "ansi_codes": codes}
    except ValueError as exc:
        out = error(call_id, "error", "INVALID_INPUT", str(exc))
    return gw.record_result(base, out)
