"""What the console's pages show, shaped on the server: an approval's card, a call's row and
page, the overview's labels. Every string that came from an agent is escaped here (line breaks,
control and invisible characters as `\\n`, `\\u{...}`), and the page puts it in as text.

A card is what a supervisor decides from in a few seconds: what the command will run, read and
write, each group summarised in one line ("binds 7 module paths as absent") with its items one
click away; the rules that ask, why, and the risk each names. What it runs comes from the
call's own `decision` record (the commands as the analyser read them) and the request's bound
files (gateway/runfiles.py); what it reads and writes is what the path jail checks for it
(`jail_paths`: the decision stages' own reading, run again for the card, since an ask's record
keeps only the asking rules' reasons). A card is made once per pending call (app.py keeps it).
"""

from __future__ import annotations

import shlex
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from gateway.analysis import analyze
from gateway.approval import escaped
from gateway.audit.calls import Call
from gateway.policy.compile import CompiledPolicy
from gateway.stages import pathjail, permissions

LISTED = 3
"""Items of a group shown by name in its summary; more are counted ("12 paths: 9 in src/")."""
MAX_ITEMS = 200
"""Items of a group listed when it is opened (the count is always whole)."""


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _group(summary: str, items: list[str], tone: str = "") -> dict[str, Any]:
    return {"summary": escaped(summary), "items": [escaped(i) for i in items[:MAX_ITEMS]], "count": len(items),
            **({"tone": tone} if tone else {})}  # fmt: skip


def _relative(path: str, cwd: str) -> str:
    if cwd and path.startswith(cwd.rstrip("/") + "/"):
        return path[len(cwd.rstrip("/")) + 1 :]
    return path


def _paths(verb: str, paths: list[str], total: int, cwd: str) -> dict[str, Any] | None:
    """One line for the paths a command reads or writes: named when few, else counted by the
    directory they are in ("reads 12 paths: 9 in src/, 3 in tests/")."""
    if not paths:
        return None
    shown = [_relative(p, cwd) for p in dict.fromkeys(paths)]
    total = max(total, len(shown))
    if total <= LISTED:
        return _group(f"{verb} {', '.join(shown)}", shown)
    where: Counter[str] = Counter()
    for p in shown:
        head, sep, _ = p.rpartition("/")
        where[(head + "/") if sep else "./"] += 1
    parts = [f"{n} in {d}" for d, n in where.most_common(LISTED)]
    if len(where) > LISTED:
        parts.append(f"{sum(where.values()) - sum(n for _, n in where.most_common(LISTED))} elsewhere")
    more = f" (the first {len(shown)} recorded)" if total > len(shown) else ""
    return _group(f"{verb} {_plural(total, 'path')}: {', '.join(parts)}{more}", shown)


def _runs(decision: dict[str, Any] | None, command: str, analysed: list[Any]) -> list[dict[str, Any]]:
    """The programs the command runs: as its decision record has them, or as the analyser
    reads the command now (`analysed`, from `jail_paths`) when the record is not at hand."""
    commands = [_map(c) for c in _list(_map(_map(decision).get("data")).get("commands"))]
    argvs = [[str(w) for w in _list(c.get("argv"))] for c in commands]
    argvs = [a for a in argvs if a] or [[str(w) for w in _list(a)] for a in analysed if _list(a)]
    if not argvs:
        return [_group(f"runs {command}", [command])] if command else []
    programs = list(dict.fromkeys(a[0] for a in argvs))
    lines = [shlex.join(a) for a in argvs]
    if len(argvs) == 1:
        return [_group(f"runs {programs[0]}", lines)]
    return [_group(f"runs {_plural(len(argvs), 'command')}: {', '.join(programs)}", lines)]


def _files(files: list[dict[str, Any]], cwd: str) -> list[dict[str, Any]]:
    """The files the command runs, grouped by what the approval binds of them."""
    by_content: list[str] = []
    absent: dict[str, list[str]] = defaultdict(list)
    modules_found: list[str] = []
    modules_absent: list[str] = []
    unbound: list[str] = []
    notices: list[str] = []
    for f in files:
        path, why, kind = _relative(str(f.get("path", "?")), cwd), str(f.get("why", "")), str(f.get("kind", "file"))
        if kind == "notice":
            notices.append(f"{path}: {why}")
        elif f.get("error"):
            unbound.append(f"{path}: {f['error']}")
        elif kind.endswith("-lookup"):
            (modules_found if f.get("head") else modules_absent).append(
                f"{path}: finds {f['head']}" if f.get("head") else f"{path} ({why})"
            )
        elif f.get("sha256") is None:
            absent[why or "the command"].append(path)
        else:
            by_content.append(f"{path} ({why}, {f.get('bytes')} B, sha256 {str(f.get('sha256'))[:12]})")
    out = []
    if len(by_content) == 1:
        out.append(_group(f"runs {by_content[0].split(' (')[0]}, bound by its content", by_content))
    elif by_content:
        out.append(_group(f"binds {_plural(len(by_content), 'file')} it runs by content", by_content))
    for why, paths in absent.items():
        out.append(_group(f"binds {_plural(len(paths), 'path')} as absent ({why})", paths))
    if modules_absent:
        out.append(_group(f"binds {_plural(len(modules_absent), 'module path')} as absent", modules_absent))
    if modules_found:
        out.append(_group(f"binds {_plural(len(modules_found), 'module')} it imports by content", modules_found))
    if unbound:
        out.append(_group(f"{_plural(len(unbound), 'file')} cannot be bound: approving is void", unbound, "warn"))
    if notices:
        out.append(_group(f"loads {_plural(len(notices), 'module')} named at run time, not bound", notices, "warn"))
    return out


def jail_paths(policy: CompiledPolicy, request: dict[str, Any]) -> dict[str, Any] | None:
    """The paths the jail checks for the asked command (`{read, write, counts?}`, as its
    `paths_checked` reason carries them), or None when they cannot be told (the command does not
    parse now, the principal is gone, the jail refuses under the policy in force)."""
    command, principal = str(request.get("command", "")), str(request.get("principal", ""))
    try:
        analysis = analyze(command)
        if analysis.denial is not None:
            return None
        matches = [permissions.decide_command(policy, principal, cmd)[1] for cmd in analysis.commands]
        decided = pathjail.check(policy, policy.grant(principal), Path(str(request.get("cwd") or policy.workspace)),
                                 analysis.commands, matches, sandboxed=True)  # fmt: skip
    except Exception:  # the card says the paths are unknown; the decision stands as recorded
        return None
    argvs = [[w.value for w in cmd.argv] for cmd in analysis.commands if cmd.argv]
    found = next((r for r in decided.reasons if r.code == "paths_checked"), None)
    if found is not None:
        return {**found.details, "commands": argvs}
    return {"read": [], "write": [], "commands": argvs} if not decided.reasons else None


def card(
    request: dict[str, Any], decision: dict[str, Any] | None, policy: CompiledPolicy, paths: dict[str, Any] | None
) -> dict[str, Any]:
    """The summary of an asked call: `runs`, `reads`, `writes` (groups: `{summary, items,
    count, tone?}`), `rules` (`{rule, why, risk}`), `recorded` (whether the call's decision
    record was found) and `paths_known` (`paths`, from `jail_paths`, could be told)."""
    cwd = str(request.get("cwd", ""))
    command = str(request.get("command", ""))
    reads = [str(p) for p in _list(_map(paths).get("read"))]
    writes = [str(p) for p in _list(_map(paths).get("write"))]
    counts = {k: v for k, v in _map(_map(paths).get("counts")).items() if isinstance(v, int)}
    files = [f for f in _list(request.get("files")) if isinstance(f, dict)]
    rules = []
    for rule_id in _list(request.get("asking")) or [request.get("rule")]:
        rule = policy.rules.get(rule_id) if isinstance(rule_id, str) else None
        rules.append({"rule": escaped(str(rule_id)) if rule_id else "(a stage asks)",
                      "why": escaped(rule.justification) if rule else escaped(str(request.get("reason", ""))),
                      "risk": escaped(rule.risk) if rule is not None and rule.risk else None})  # fmt: skip
    out = {
        "runs": _runs(decision, command, _list(_map(paths).get("commands"))) + _files(files, cwd),
        "reads": [g for g in [_paths("reads", reads, counts.get("read", 0), cwd)] if g],
        "writes": [g for g in [_paths("writes", writes, counts.get("write", 0), cwd)] if g],
        "rules": rules,
        "recorded": decision is not None,
        "paths_known": paths is not None,
    }
    return out


def unknown(why: str) -> dict[str, Any]:
    """The card of a call whose summary could not be made: it says so (the command, its
    environment and files are shown whole all the same)."""
    return {"runs": [_group(f"cannot summarise this call ({why}): read the details below", [], "warn")],
            "reads": [], "writes": [], "rules": [], "recorded": False, "paths_known": False}  # fmt: skip


_TEXT = ("principal", "tool", "command", "approved_by", "approval_reason", "reason", "error", "parent", "call_id")


def call_row(call: Call) -> dict[str, Any]:
    """A call's row of the timeline (calls.py's fields), agent-made strings escaped."""
    row = call.to_json()
    row.pop("origin", None)
    for k in _TEXT:
        if isinstance(row.get(k), str):
            row[k] = escaped(row[k])
    return row


def call_page(found: dict[str, Any]) -> dict[str, Any]:
    """A call's page (auditview.CallIndex.call): its row and story escaped; the records as
    they are (the page shows them as JSON text)."""
    call = found["call"]
    for k in _TEXT:
        if isinstance(call.get(k), str):
            call[k] = escaped(call[k])
    for step in found["story"]:
        step["text"] = escaped(str(step["text"]))
    for part in found["parts"]:
        for k in _TEXT:
            if isinstance(part.get(k), str):
                part[k] = escaped(part[k])
    return found


def overview_shown(o: dict[str, Any]) -> dict[str, Any]:
    """The overview (gateway/audit/overview.py) with the names and commands escaped."""
    for group in (o["denied"]["rules"], o["denied"]["commands"]):
        for row in group["top"]:
            row["name"] = escaped(row["name"])
    for row in o["principals"]:
        row["principal"] = escaped(row["principal"])
    return o
