"""The `gateway` command. Thin: parse arguments, call the library, print, exit.

Exit codes (DESIGN.md section 5): 0 allow / success, 1 deny, 2 usage or config error, 3 ask.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.defaults import (
    DEFAULT_AUDIT_KEYS,
    DEFAULT_POLICY,
    DEFAULT_PROCESS_DIR,
    DEFAULT_STATE_DIR,
    DEFAULT_TOKENS,
    PROFILE_POLICIES,
    STATE_HOME,
)

# Each command imports what it uses, when it runs: `gateway hook` and `gateway check` do not pay
# for the MCP server, the sandbox or the audit verbs (docs/performance.md, "Hooks").
if TYPE_CHECKING:
    from gateway.audit.sink import AuditSink
    from gateway.decide import CheckResult
    from gateway.policy.compile import CompiledPolicy

EXIT_OK, EXIT_DENY, EXIT_USAGE, EXIT_ASK = 0, 1, 2, 3


def _cmd_analyze(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.analysis import analyze

    text = " ".join(args.command) if args.command else sys.stdin.read()
    result = analyze(text, second_opinion_enabled=not args.no_second_opinion)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    elif result.denial is not None:
        print(f"denied ({result.denial.code}): {result.denial.message}")
    else:
        for cmd in result.commands:
            argv = " ".join(json.dumps(w.value, ensure_ascii=False) for w in cmd.argv) or "(no program)"
            where = "/".join(c.value for c in cmd.context) or "top"
            print(f"{argv}    [{where}]")
        op = result.second_opinion
        extra = f" ({', '.join(op.blind_spots) or op.detail})" if (op.blind_spots or op.detail) else ""
        print(f"second opinion: {op.status.value}{extra}")
    return EXIT_DENY if result.denied else EXIT_OK


_EXIT_FOR = {"allow": EXIT_OK, "deny": EXIT_DENY, "ask": EXIT_ASK}


def _fatal(message: str) -> int:
    """The one exit path for usage and configuration errors."""
    print(f"gateway: {message}", file=sys.stderr)
    return EXIT_USAGE


def _policy(args: argparse.Namespace) -> CompiledPolicy:
    # lazy: startup (each command imports what it uses)
    from gateway.policy.selftest import load_checked

    return load_checked(Path(args.policy), Path(args.workspace) if args.workspace else None)


def _principal(args: argparse.Namespace, policy: CompiledPolicy) -> str:
    # lazy: startup (each command imports what it uses)
    from gateway.policy.loader import PolicyError

    if args.principal:
        return str(args.principal)
    if len(policy.grants) == 1:
        return next(iter(policy.grants))
    raise PolicyError(f"the policy defines several principals ({', '.join(sorted(policy.grants))}): pass --principal")


def _explain(result: CheckResult) -> str:
    d = result.decision
    lines = [f"{d.verdict.label}" + (f"  (rule: {d.rule})" if d.rule else "")]
    lines += [f"  {r.stage}: {r.message}" for r in d.reasons]
    if result.analysis is not None and result.analysis.commands:
        shown = ["  " + (" ".join(w.value for w in c.argv) or "(no program)") for c in result.analysis.commands]
        lines += ["commands:", *shown]
    return "\n".join(lines)


def _cmd_check(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.decide import evaluate
    from gateway.doctor import NETWORK_TRUE_WARNING
    from gateway.policy.loader import PolicyError

    try:
        policy = _policy(args)
        default_principal = _principal(args, policy) if not args.batch else args.principal
    except PolicyError as exc:
        return _fatal(str(exc))
    if policy.policy.sandbox.network is True:
        print(f"gateway: warning: {NETWORK_TRUE_WARNING}", file=sys.stderr)
    if args.batch:
        return _check_batch(args, policy, default_principal)
    text = " ".join(args.command) if args.command else ""
    if not text:
        return _fatal("check needs a command: gateway check -- 'git status'")
    cwd = Path(args.cwd).resolve() if args.cwd else None
    result = evaluate(policy, text, default_principal, cwd)
    print(json.dumps(result.to_json(), ensure_ascii=False) if args.json else _explain(result))
    return _EXIT_FOR[result.decision.verdict.label]


def _check_batch(args: argparse.Namespace, policy: CompiledPolicy, principal: str | None) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.decide import evaluate
    from gateway.decision import Verdict
    from gateway.policy.loader import PolicyError

    worst = Verdict.ALLOW
    try:
        source = sys.stdin if args.batch == "-" else open(args.batch, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        return _fatal(f"{args.batch}: {exc.strerror}")
    with source:
        for n, line in enumerate(source, 1):
            if not line.strip():
                continue
            try:
                spec = json.loads(line)
                command = spec["command"]
                who = spec.get("principal") or principal or _principal(args, policy)
            except (ValueError, KeyError, TypeError, PolicyError) as exc:
                return _fatal(f'{args.batch}:{n}: each line must be {{"command": ...}}: {exc}')
            cwd = Path(spec["cwd"]).resolve() if spec.get("cwd") else None
            result = evaluate(policy, command, who, cwd)
            out = {"command": command, **result.to_json()}
            print(json.dumps(out, ensure_ascii=False))
            worst = max(worst, result.decision.verdict)
    return _EXIT_FOR[worst.label]


def _cmd_policy(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.decide import example_decisions, test_cases
    from gateway.policy.compile import load_policy
    from gateway.policy.loader import PolicyError
    from gateway.policy.schema import Policy
    from gateway.policy.selftest import check_examples, example_cases

    if args.action == "schema":
        print(json.dumps(Policy.model_json_schema(), indent=2))
        return EXIT_OK
    path = Path(args.path or args.policy)
    if args.action == "publish":  # the fleet's next revision: checked, signed, stored
        # lazy: startup (the store and psycopg load only for the fleet's commands)
        from gateway.store.commands import dsn_of, policy_publish

        dsn = dsn_of(args)
        return policy_publish(args, path, dsn) if dsn else _fatal("policy publish needs --store postgresql://...")
    try:
        policy = load_policy(path, Path(args.workspace) if args.workspace else None)
    except PolicyError as exc:
        return _fatal(str(exc))
    if args.action == "validate":
        try:
            check_examples(policy)
        except PolicyError as exc:
            return _fatal(str(exc))
        print(f"{path}: valid ({len(policy.rules)} rules, sha256 {policy.sha256[:16]})")
        return EXIT_OK
    try:
        principal = _principal(args, policy)
    except PolicyError as exc:
        return _fatal(str(exc))
    cases = example_cases(policy) + example_decisions(policy, principal) + test_cases(policy, principal)
    for case in cases:
        print(("PASS " if case.passed else "FAIL ") + case.name + (f": {case.detail}" if case.detail else ""))
    failed = sum(1 for c in cases if not c.passed)
    print(f"{len(cases) - failed} passed, {failed} failed")
    return EXIT_OK if failed == 0 else EXIT_DENY


def _cmd_run(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    import gateway.tools  # noqa: F401  (registers the tool families with the gate: gateway/families.py)
    from gateway import approval_queue
    from gateway.approval import Approver, DenyAll, TerminalApprover
    from gateway.audit import AuditUnavailable
    from gateway.calls import RunCall
    from gateway.pipeline import Gateway
    from gateway.policy.loader import PolicyError
    from gateway.policy.reload import PolicyHolder
    from gateway.store.commands import fleet_approver, spool_dirs

    text = " ".join(args.command)
    if not text:
        return _fatal("run needs a command: gateway run -- 'make test'")
    try:
        # the policy is read once: its events wait for the audit log, which its settings open
        waiting: list[tuple[str, dict[str, Any]]] = []
        workspace = Path(args.workspace) if args.workspace else None
        holder = PolicyHolder(Path(args.policy), workspace, on_event=lambda kind, data: waiting.append((kind, data)))
        policy = holder.current()
        audit = _ledger(args, policy.policy.audit.redact)

        def record(kind: str, data: dict[str, Any]) -> None:  # policy_loaded / policy_rejected
            audit.append(kind, data=data)

        for kind, data in waiting:
            record(kind, data)
        holder.on_event = record
        principal = _principal(args, policy)
    except (PolicyError, AuditUnavailable) as exc:
        return _fatal(str(exc))
    approver: Approver
    if args.approver == "tty":
        approver = TerminalApprover(os.environ.get("USER", "supervisor"))
    elif args.approver == "queue" and (fleet := fleet_approver(audit, lambda line: print(line, file=sys.stderr))):
        approver = fleet  # --store: the fleet's inbox, answered from any host
    elif args.approver == "queue":
        try:
            approver = approval_queue.QueueApprover(Path(args.state_dir), policy.grant(principal).write_roots)
        except approval_queue.QueueError as exc:
            return _fatal(str(exc))
        print(f"gateway: asks wait for `gateway approvals approve ID --state-dir {args.state_dir}`", file=sys.stderr)
    else:
        approver = DenyAll()
    gw = Gateway(holder.current, audit, approver, hidden=(Path(args.audit_keys), *spool_dirs(args)))
    result = gw.handle(RunCall(principal=principal, command=text, cwd=args.cwd))
    gw.close()
    if result.get("stdout"):
        sys.stdout.write(result["stdout"])
    if result.get("stderr"):
        sys.stderr.write(result["stderr"])
    for refused in (result.get("network") or {}).get("refused", []):
        print(f"gateway: network refused: {refused}", file=sys.stderr)
    if "error" in result:
        print(f"gateway: {result['error']['code']}: {result['error']['message']}", file=sys.stderr)
    if result.get("status") in ("denied", "error"):
        return EXIT_DENY
    if result.get("status") == "timeout":
        return 124
    return int(result.get("exit_code") or 0)


def _ledger(args: argparse.Namespace, redact: list[str]) -> AuditSink:
    """The gateway's ledger: the fleet's store with --store (or AGW_STORE), else the files of
    --audit-dir. Raises AuditUnavailable naming what cannot be used."""
    # lazy: startup (each command imports what it uses)
    from gateway.store.commands import commit_timeout_of, dsn_of, spool_of
    from gateway.store.ledger import open_sink

    # one call and gone: it does not compete to be the fleet's sequencer
    return open_sink(
        dsn_of(args), Path(args.audit_dir), Path(args.audit_keys), redact=redact, sequence=False, spool=spool_of(args),
        commit_timeout=commit_timeout_of(args),
    )  # fmt: skip


def _supervisor(args: argparse.Namespace) -> str:
    import getpass

    return str(args.by or os.environ.get("SUDO_USER") or getpass.getuser())


LIST_WIDTH = 60  # characters of a command `approvals list` shows before it marks the cut


def _cmd_approvals(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.store.commands import StoreInbox, dsn_of
    from gateway.store.db import StoreError

    state = Path(args.state_dir)
    dsn = dsn_of(args)  # the fleet's inbox (every gateway's asks), else this host's queue
    try:
        inbox = StoreInbox(dsn) if dsn else None
        return _approvals(args, state, inbox)
    except StoreError as exc:
        return _fatal(str(exc))


def _approvals(args: argparse.Namespace, state: Path, inbox: Any) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway import approval_queue
    from gateway.approval import escaped, shortened

    if args.action == "list":
        rows = inbox.pending() if inbox else approval_queue.pending(state)
        for r in rows:
            left = int(r["expires"] - time.time())
            command = shortened(escaped(str(r["command"])), LIST_WIDTH, f"approvals show {r['call_id']}")
            print(
                f"{r['call_id']}  {escaped(str(r['principal'])):10}  {escaped(str(r.get('tool') or '-')):7}  "
                f"{escaped(str(r.get('rule') or '-')):14}  {left:4d}s left  {command}"
            )
        if not rows:
            print("no pending approvals")
        return EXIT_OK
    if not args.call_id:
        return _fatal(f"approvals {args.action} needs a CALL_ID (see: gateway approvals list)")
    if args.action == "show":
        rows = [
            r for r in (inbox.pending() if inbox else approval_queue.pending(state)) if r["call_id"] == args.call_id
        ]
        if not rows:
            return _fatal(f"no pending request {args.call_id}")
        print(_show_request(rows[0]))
        return EXIT_OK
    try:
        scope = "session" if args.session else "once"
        if inbox is not None:  # as the database login: --by names nobody there
            done = inbox.answer(args.call_id, args.action == "approve", args.reason or "", scope)
        else:
            done = approval_queue.answer(
                state, args.call_id, args.action == "approve", _supervisor(args), args.reason or "", scope
            )
    except approval_queue.QueueError as exc:
        return _fatal(str(exc))
    said = f" ({escaped(done['reason'])})" if done.get("reason") else ""
    print(f"{'approved' if done['approved'] else 'denied'} {done['call_id']} as {done['by']}{said}")
    return EXIT_OK


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _show_request(r: dict[str, Any]) -> str:
    """A pending request in full: every character of the command (escaped), and the environment
    the command will run with: the principal's stored variables, overridden by the call's."""
    # lazy: startup (each command imports what it uses)
    from gateway.approval import escaped, visible
    from gateway.audit import SECRET_NAME

    inherited = _mapping(r.get("inherited"))
    own = _mapping(r.get("env"))
    env_lines = []
    for name in sorted({**inherited, **own}):
        value = str(own[name] if name in own else inherited[name])
        shown = f"[secret: {len(value)} chars]" if SECRET_NAME.search(name) else escaped(value)
        origin = "this call" if name in own else "stored (env tool)"
        over = ", overrides the stored value" if name in own and name in inherited else ""
        env_lines.append(f"           {escaped(name)}={shown}    ({origin}{over})")
    env = "\n".join(env_lines) if env_lines else "           (none besides the sandbox's own)"
    left = int(r["expires"] - time.time())
    return (
        f"call:      {r['call_id']} ({escaped(str(r['principal']))}, tool {escaped(str(r['tool']))}, {left} s left)\n"
        f"command:   {visible(str(r['command']))}\n"
        f"           ({len(str(r['command']))} characters; escapes: \\n line break, \\u{{...}} invisible)\n"
        f"cwd:       {visible(str(r['cwd']))}\n"
        f"env:\n{env}\n"
        f"rule:      {r.get('rule')}\n"
        f"why:       {visible(str(r['reason']))}\n"
        f"{_show_files(r.get('files'))}"
        f"digest:    {r['digest']}\n"
        f"answer:    gateway approvals approve {r['call_id']}   |   gateway approvals deny {r['call_id']} --reason ..."
    )


def _show_files(files: Any) -> str:
    """The files the asked command runs (gateway/runfiles.py), each with its digest and its first
    lines escaped: the approval is of this content; a change before the command starts voids it."""
    # lazy: startup (each command imports what it uses)
    from gateway.approval import escaped
    from gateway.runfiles import BoundFile

    if not isinstance(files, list) or not files:
        return ""
    out = ["runs:      these files; the approval binds their content (changed before it starts: void)\n"]
    for entry in files:
        f = BoundFile.from_json(_mapping(entry))
        out.append(f"  {escaped(f.describe())}   ({escaped(f.why)})\n")
        lines = f.head.splitlines()
        for line in lines[:HEAD_LINES]:
            out.append(f"    | {escaped(line)}\n")
        if f.bytes is not None and (len(lines) > HEAD_LINES or len(f.head.encode()) < f.bytes):
            out.append(f"    | ... (first {min(len(lines), HEAD_LINES)} lines shown; {f.bytes} bytes in all)\n")
    return "".join(out)


HEAD_LINES = 40
"""Lines of each file `approvals show` prints."""


AUDIT_READ_EXIT = {"ok": 0, "none": 1, "usage": 2, "unreadable": 3}
"""`gateway audit tail|show|query|calls`: 0 something matched and was printed, 1 nothing matched,
2 usage (a time or filter it cannot take), 3 the log has lines that are not records (printed
what could be read; see `gateway audit verify`)."""
RECORD_COLUMNS = ("ts", "seq", "event", "principal", "tool", "decision", "rule", "call_id", "parent", "what", "hash")
CALL_COLUMNS = ("when", "call_id", "principal", "tool", "command", "decision", "rule", "final", "approved_by",
                "approval_how", "outcome", "error", "exit_code", "duration_ms", "bytes", "parent", "ended")  # fmt: skip


def _audit_replay(args: argparse.Namespace, directory: Path, source: Any = None, where: str | None = None) -> int:
    """`gateway audit replay`: the recorded command decisions decided again under a draft
    (gateway/replay.py). Exit 0 nothing would change, 1 something would, 2 errors."""
    # lazy: startup (each command imports what it uses)
    from gateway.replay import ReplayError, describe, replay
    from gateway.upstream import replay as _registers  # noqa: F401  (the upstream family's decisions are replayed too)

    def _fail(message: str) -> int:
        print(f"gateway audit: {message}", file=sys.stderr)
        return EXIT_USAGE

    if not args.policy:
        return _fail("audit replay needs --policy DRAFT (the policy to decide the recorded calls under)")
    for name in ("max_rows", "max_calls"):
        if getattr(args, name) < 0:
            return _fail(f"audit replay --{name.replace('_', '-')} {getattr(args, name)}: expected 0 or more")
    try:
        report = replay(
            Path(args.policy), where or directory, args.since, args.until,
            workspace=Path(args.workspace) if args.workspace else None,
            max_rows=args.max_rows, max_calls=args.max_calls, source=source,
        )  # fmt: skip
    except ReplayError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
    else:
        print(describe(report))
    return EXIT_DENY if report.changed else EXIT_OK


def _cmd_audit(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.audit import records as audit_records
    from gateway.store import reader
    from gateway.store.commands import dsn_of, verify_main
    from gateway.store.db import Store, StoreError

    dsn = dsn_of(args)
    if dsn and args.action == "verify":
        return verify_main(args, dsn)
    if dsn and args.action in ("repair", "head", "adopt"):
        return _fatal(f"audit {args.action} is for the files of one host: the store's ledger has `gateway audit "
                      "verify --store` and `gateway store checkpoint`")  # fmt: skip
    directory = Path(args.audit_dir)
    if not dsn and not directory.is_dir():
        return _fatal(f"no audit directory at {directory}")
    if not dsn:
        return _audit_read(args, directory, lambda: audit_records(directory))
    try:  # the fleet's ledger: every stream, in the global order (gateway/store/reader.py)
        with Store(dsn) as store:
            return _audit_read(
                args, directory, lambda: reader.records(store), lambda: reader.StoreLines(store), store.name
            )
    except StoreError as exc:
        return _fatal(str(exc))


def _audit_read(
    args: argparse.Namespace, directory: Path, source: Any, lines: Any = None, where: str | None = None
) -> int:
    """The reading verbs over `source` (every record, in order); `lines` makes a reader of the
    records as they come (tail -f, export: the store's; None: the files in `directory`)."""
    # lazy: startup (each command imports what it uses)
    from gateway.audit import commands as audit_verbs
    from gateway.audit.calls import Folder
    from gateway.audit.export import redactor
    from gateway.audit.timespec import TimeSpecError

    if args.action == "replay":
        return _audit_replay(args, directory, source if lines is not None else None, where)
    if args.action in ("verify", "repair", "head", "adopt", "export"):
        return audit_verbs.main(args, directory, lines)
    fmt = "jsonl" if args.json and args.format == "text" else args.format
    if fmt == "otlp":
        return _fatal(f"audit {args.action} --format otlp: spans go to a collector: use `gateway audit export`")
    if args.action == "show" and not args.call_id:
        return _fatal("audit show needs a CALL_ID")
    if args.action == "tail" and args.n < 0:
        return _fatal(f"audit tail -n {args.n}: expected a count of records, 0 or more")
    try:
        selection = audit_verbs.selection(args, [args.call_id] if args.action == "show" else [])
    except TimeSpecError as exc:
        return _fatal(str(exc))
    clean = redactor(args.redact or ())
    out = _AuditOut(fmt)
    unreadable = 0
    if args.action == "calls":
        folder = Folder(selection, keep_records=args.records or fmt in ("ecs", "ocsf"))
        for _, _, r, raw in source():
            if r is None:
                unreadable += int(bool(raw.strip()))
            else:
                folder.add(clean(r, raw), raw)
        calls = list(folder.matching())
        for call in calls:
            out.call(call, args.records)
        matched = bool(calls)
    elif args.action == "tail" and args.follow:
        return _follow(lines() if lines is not None else None, directory, selection, clean, out, args.n)
    else:
        rows = []
        for _, _, r, raw in source():
            if r is None:
                unreadable += int(bool(raw.strip()))
            elif selection.matches(r, raw):
                rows.append(r)
        matched = bool(rows)
        if args.action == "tail":
            rows = rows[len(rows) - args.n :] if args.n else []  # -n 0: none (rows[-0:] would be all)
        for r in rows:
            out.record(clean(r, None))
        if args.action == "show" and not rows:
            print(f"gateway: no records for call {args.call_id}", file=sys.stderr)
    if unreadable:
        print(f"gateway: {unreadable} line(s) of the log are not records: skipped (see `gateway audit verify`)",
              file=sys.stderr)  # fmt: skip
        return AUDIT_READ_EXIT["unreadable"]
    return AUDIT_READ_EXIT["ok" if matched else "none"]


class _AuditOut:
    """Prints records and calls in one of the reading formats."""

    def __init__(self, fmt: str) -> None:
        import csv

        # lazy: startup (each command imports what it uses)
        from gateway.audit.export import MAPPINGS

        self.fmt = fmt
        self.mapping = MAPPINGS.get(fmt)
        self.host = os.uname().nodename
        self.csv = csv.writer(sys.stdout, lineterminator="\n") if fmt == "csv" else None
        self.header = False

    def _row(self, columns: tuple[str, ...], values: list[Any]) -> None:
        assert self.csv is not None
        if not self.header:
            self.csv.writerow(columns)
            self.header = True
        self.csv.writerow(["" if v is None else v for v in values])
        sys.stdout.flush()

    def record(self, r: dict[str, Any]) -> None:
        if self.fmt == "text":
            _print_record(r, False)
        elif self.csv is not None:
            # lazy: startup (each command imports what it uses)
            from gateway.audit.describe import describe_record

            self._row(RECORD_COLUMNS, [describe_record(r) if c == "what" else r.get(c) for c in RECORD_COLUMNS])
        else:
            assert self.mapping is not None
            print(json.dumps(self.mapping(r, self.host), ensure_ascii=False), flush=True)

    def call(self, call: Any, expand: bool) -> None:
        # lazy: startup (each command imports what it uses)
        from gateway.approval import escaped

        if self.fmt in ("ecs", "ocsf"):
            for r in call.records:
                self.record(r)
            return
        if self.fmt == "jsonl":
            print(json.dumps(call.to_json(), ensure_ascii=False), flush=True)
            return
        if self.csv is not None:
            data = call.to_json()
            self._row(CALL_COLUMNS, [data.get(c) for c in CALL_COLUMNS])
            return

        def col(value: Any, width: int) -> str:
            return f"{escaped(str(value)) if value not in (None, '') else '-':{width}}"

        decided = f"{call.decision or '-'}({call.rule})" if call.rule else (call.decision or "-")
        if call.final and call.final != call.decision:
            decided += f"->{call.final}"
        who = f"by {escaped(call.approved_by)}" if call.approved_by else (call.approval_how or "")
        ran = call.outcome + (f" exit {call.exit_code}" if call.exit_code is not None else "")
        ran += f" {call.error}" if call.error and call.outcome != "ok" else ""
        took = f"{call.duration_ms} ms" if call.duration_ms is not None else "-"
        size = f"{call.bytes} B" if call.bytes is not None else "-"
        print(
            f"{call.when[:23]:23}  {col(call.principal, 10)}  {col(call.tool, 7)}  {col(decided, 22)}  "
            f"{col(who, 14)}  {col(ran, 24)}  {took:>9}  {size:>9}  {col(call.call_id, 16)}  "
            f"{escaped(call.command) or '-'}" + (f"   (part of {escaped(call.parent)})" if call.parent else ""),
            flush=True,
        )
        if expand:
            for r in call.records:
                print("    ", end="")
                _print_record(r, False)


def _print_record(r: dict[str, Any], as_json: bool) -> None:
    """One record on one line: when, which record, who, which tool, the decision and its rule,
    the call, and what it was about (the command, escaped; an answer; a result). Whatever the
    agent wrote is escaped, so no record can forge or hide a line."""
    # lazy: startup (each command imports what it uses)
    from gateway.audit.describe import describe_record
    from gateway.escaping import escaped

    if as_json:
        print(json.dumps(r, ensure_ascii=False), flush=True)
        return

    def col(value: Any, width: int) -> str:
        return f"{escaped(str(value)) if value not in (None, '') else '-':{width}}"

    print(
        f"{str(r.get('ts', ''))[:23]:23}  {r.get('seq', ''):>6}  {col(r.get('event'), 18)}  "
        f"{col(r.get('principal'), 10)}  {col(r.get('tool'), 7)}  {col(r.get('decision'), 5)}  "
        f"{col(r.get('rule'), 16)}  {col(r.get('call_id'), 16)}  "
        f"{describe_record(r)}",
        flush=True,
    )


"""What a record is about, on one escaped line (the console's timeline shows it too)."""


def _follow(reader: Any, directory: Path, selection: Any, clean: Any, out: _AuditOut, n: int) -> int:
    """`audit tail -f`: the last `n` matching records, then new ones as they are written (read
    from where the log ended, never the whole log again; Ctrl-C ends). `reader`: the store's
    (gateway/store/reader.py: every stream as its records commit), else the files'."""
    import collections

    # lazy: startup (each command imports what it uses)
    from gateway.audit.follow import LogReader

    reader = reader or LogReader(directory, signed=False)  # every complete line, as soon as it is there
    last: collections.deque[dict[str, Any]] = collections.deque(maxlen=n)
    try:
        while lines := reader.read(64 << 20):
            last.extend(ln.record for ln in lines if ln.record is not None and selection.matches(ln.record, ln.raw))
        for r in last:
            out.record(clean(r, None))
        while True:
            lines = reader.read()
            for line in lines:
                if line.record is not None and selection.matches(line.record, line.raw):
                    out.record(clean(line.record, line.raw))
            if not lines:
                time.sleep(0.25)
    except KeyboardInterrupt:
        return EXIT_OK


def _cmd_upstream(args: argparse.Namespace) -> int:
    """`gateway upstream list|diff|accept`: the pinned definitions of upstream tools, the drift
    that blocks a tool (with its diff), and accepting it (recorded in the audit log first)."""
    # lazy: startup (each command imports what it uses)
    from gateway.approval import escaped
    from gateway.audit import AuditUnavailable, open_signed
    from gateway.upstream.pins import PinError, PinStore, store_dir

    pins = PinStore(store_dir(Path(args.process_dir)))
    try:
        if args.action == "list":
            state = pins.state()["upstreams"]
            if args.json:
                pending = [d.to_json() for d in pins.drifts()]
                pinned = {u: {t: p["sha256"] for t, p in e.get("pinned", {}).items()} for u, e in state.items()}
                print(json.dumps({"pinned": pinned, "drift": pending}, indent=2, ensure_ascii=False))
                return EXIT_OK
            for name, entry in sorted(state.items()):
                for tool, pin in sorted(entry.get("pinned", {}).items()):
                    print(f"{escaped(name)}.{escaped(tool)}  pinned  {pin['sha256'][:16]}  by {escaped(pin.get('by'))}")
            for d in pins.drifts():
                print(f"{escaped(d.upstream)}.{escaped(d.tool)}  BLOCKED ({d.kind})  {d.seen_sha256[:16]}  since "
                      f"{d.since}: gateway upstream diff {escaped(d.upstream)} {escaped(d.tool)}")  # fmt: skip
            if not state:
                print(f"no upstream pinned yet in {pins.path}")
            return EXIT_OK
        if not args.upstream or not args.tool:
            return _fatal(f"upstream {args.action} needs UPSTREAM TOOL (see: gateway upstream list)")
        found = [d for d in pins.drifts(args.upstream) if d.tool == args.tool]
        if not found:
            return _fatal(f"{args.upstream}.{args.tool}: nothing pending (it is pinned as listed, or unknown)")
        drift = found[0]
        print("\n".join(escaped(line) for line in drift.to_json()["diff"].splitlines()))
        if args.action == "diff":
            print(
                f"to accept it: gateway upstream accept {args.upstream} {args.tool} --sha256 {drift.seen_sha256[:16]}"
            )
            return EXIT_OK
        audit = open_signed(Path(args.audit_dir), Path(args.audit_keys))
        by = _supervisor(args)

        def record(event: str, data: dict[str, Any]) -> None:
            audit.append(event, tool="upstream", data={**data, "via": "cli"})

        done = pins.accept(args.upstream, args.tool, args.sha256, by, record)
    except (PinError, AuditUnavailable) as exc:
        return _fatal(str(exc))
    print(f"accepted {escaped(done.upstream)}.{escaped(done.tool)} ({done.kind}) as {done.seen_sha256[:16]}, by "
          f"{escaped(by)}; recorded in {args.audit_dir}")  # fmt: skip
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.server import serve

    return serve.main(args)


def _cmd_token(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway import tokens
    from gateway.approval import escaped
    from gateway.policy.loader import PolicyError
    from gateway.store.commands import dsn_of, token_main

    dsn = dsn_of(args)
    if dsn:  # the fleet's tokens: made, listed and revoked in the store, for every gateway
        if args.action == "create" and args.principal and not (args.supervisor or args.metrics):
            try:
                policy = _policy(args)
            except PolicyError as exc:
                return _fatal(str(exc))
            if args.principal not in policy.grants:
                known = ", ".join(sorted(policy.grants))
                return _fatal(f"{args.policy}: no principal {args.principal!r} (the policy defines: {known})")
        return token_main(args, dsn)

    path = Path(args.tokens)
    try:
        if args.action == "create" and args.supervisor:
            if args.principal or args.metrics:
                return _fatal("token create takes --principal NAME (an agent's token) or --supervisor NAME, not both")
            token, entry = tokens.create(path, args.supervisor, args.label or "", kind=tokens.SUPERVISOR)
            print(f"created supervisor secret {entry.id} for {entry.principal} in {path} (shown once; only its "
                  "hash is kept). It signs in to the console (/console/) and is the bearer token of its API; "
                  "it never authenticates an MCP client:", file=sys.stderr)  # fmt: skip
            print(token)
        elif args.action == "create" and args.metrics:
            if args.principal:
                return _fatal("token create takes --principal NAME (an agent's token) or --metrics NAME, not both")
            token, entry = tokens.create(path, args.metrics, args.label or "", kind=tokens.METRICS)
            print(f"created metrics token {entry.id} for {entry.principal} in {path} (shown once; only its hash is "
                  "kept). It reads GET /metrics of the HTTP server and nothing else:", file=sys.stderr)  # fmt: skip
            print(token)
        elif args.action == "create":
            if not args.principal:
                return _fatal("token create needs --principal NAME (a principal of the policy) or --supervisor NAME")
            policy = _policy(args)
            if args.principal not in policy.grants:
                known = ", ".join(sorted(policy.grants))
                return _fatal(f"{args.policy}: no principal {args.principal!r} (the policy defines: {known})")
            token, entry = tokens.create(path, args.principal, args.label or "")
            print(f"created token {entry.id} for {entry.principal} in {path} (shown once; only its hash is kept):",
                  file=sys.stderr)  # fmt: skip
            print(token)
        elif args.action == "list":
            for e in tokens.load(path):
                print(f"{e.id}  {e.kind:10}  {escaped(e.principal):12}  {e.created}  {escaped(e.label)}")
        else:
            if not args.token_id:
                return _fatal("token revoke needs a TOKEN_ID (see: gateway token list)")
            gone = tokens.revoke(path, args.token_id)
            print(f"revoked {gone.kind} {gone.id} ({escaped(gone.principal)})")
    except (tokens.TokenError, PolicyError) as exc:
        return _fatal(str(exc))
    return EXIT_OK


def _cmd_store(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.store.commands import store_main

    return store_main(args)


def _cmd_doctor(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway import doctor
    from gateway.policy.compile import load_policy
    from gateway.policy.loader import PolicyError

    policy = None
    if args.policy:
        try:
            policy = load_policy(Path(args.policy), Path(args.workspace) if args.workspace else None)
        except PolicyError as exc:
            return _fatal(str(exc))
    report = doctor.run(policy)
    print(json.dumps(report.to_json(), indent=2, ensure_ascii=False) if args.json else report.text())
    return EXIT_OK if report.ok else EXIT_DENY


def _cmd_daemon(args: argparse.Namespace) -> int:
    # lazy: startup (each command imports what it uses)
    from gateway.hooks import daemon

    return daemon.main(args)


def _common_options(policy_default: str | None, policy_help: str) -> argparse.ArgumentParser:
    """The options every policy-reading command takes (a parser of its own each time: argparse
    shares a parent's option objects between the commands that use it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--policy", default=policy_default, help=policy_help)
    common.add_argument("--workspace", help="the jail root relative roots resolve against (default: the policy's)")
    common.add_argument("--audit-dir", default="audit", help="where audit logs go (default: %(default)s)")
    common.add_argument(
        "--audit-keys", default=DEFAULT_AUDIT_KEYS, help="the audit signing key and checkpoints (default: %(default)s)"
    )
    common.add_argument("--principal", help="who is asking (default: the policy's only principal)")
    _store_option(common)
    common.add_argument("--store-spool", metavar="DIR",
                        help="with --store: keep records here while the store is away, forwarded when it is back "
                        "(default: $AGW_STORE_SPOOL; none: calls are refused)")  # fmt: skip
    common.add_argument("--store-spool-max", metavar="BYTES", type=_positive_int,
                        help="the spool's bound per gateway process: past it calls are refused "
                        "(default: $AGW_STORE_SPOOL_MAX, else 64 MiB)")  # fmt: skip
    common.add_argument("--store-commit-timeout", metavar="SECONDS",
                        help="with --store: a record's commit unanswered this long (a synchronous "
                        "standby that stopped answering) refuses its call "
                        "(default: $AGW_STORE_COMMIT_TIMEOUT, else 30)")  # fmt: skip
    return common


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", metavar="postgresql://...", help="the fleet's store (default: $AGW_STORE; none: this host's files)"
    )


def build_parser() -> argparse.ArgumentParser:
    # lazy: startup (each command imports what it uses)
    from gateway.server.limits import FrontLimits

    ap = argparse.ArgumentParser(prog="gateway", description="agent-gateway: a policy gate for LLM agents")
    sub = ap.add_subparsers(dest="verb", required=True)
    an = sub.add_parser("analyze", help="show every command a shell text would run (runs nothing)")
    an.add_argument("--json", action="store_true", help="print the analysis as JSON")
    an.add_argument("--no-second-opinion", action="store_true", help="skip the bashlex cross-check")
    an.add_argument("command", nargs=argparse.REMAINDER, help="the shell text (after --); stdin if absent")
    an.set_defaults(func=_cmd_analyze)
    common = _common_options(str(DEFAULT_POLICY), "policy file (default: %(default)s)")
    ck = sub.add_parser("check", parents=[common], help="the decision for a command; runs nothing")
    ck.add_argument("--cwd", help="directory the command would run in (default: the workspace)")
    ck.add_argument("--json", action="store_true", help="print the decision as JSON")
    ck.add_argument("--batch", metavar="FILE.jsonl", help='one {"command", "cwd"?, "principal"?} per line ("-": stdin)')
    ck.add_argument("command", nargs=argparse.REMAINDER, help="the shell text, after --")
    ck.set_defaults(func=_cmd_check)
    po = sub.add_parser("policy", parents=[common], help="validate, test or describe a policy")
    po.add_argument("action", choices=["validate", "test", "schema", "publish"])
    po.add_argument("--signing-key", default=str(STATE_HOME / "policy-keys"),
                    help="publish: the key the revision is signed with (default: %(default)s)")  # fmt: skip
    po.add_argument("path", nargs="?", help="the policy file (default: --policy)")
    po.set_defaults(func=_cmd_policy)
    rn = sub.add_parser("run", parents=[common], help="run a command through the whole pipeline, in the sandbox")
    rn.add_argument("--cwd", help="directory to run in (default: the workspace)")
    rn.add_argument("--approver", choices=["tty", "queue", "deny"], default="deny", help="who answers ask decisions")
    rn.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="the approvals directory for --approver queue")
    rn.add_argument("command", nargs=argparse.REMAINDER, help="the shell text, after --")
    rn.set_defaults(func=_cmd_run)
    ap_ = sub.add_parser("approvals", help="list and answer pending approvals (as a supervisor)")
    ap_.add_argument("action", choices=["list", "show", "approve", "deny"])
    ap_.add_argument("call_id", nargs="?")
    ap_.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="the approvals directory (default: %(default)s)")
    ap_.add_argument("--reason", help="why (recorded with the answer)")
    _store_option(ap_)
    ap_.add_argument("--by", help="the supervisor's name (default: the login name)")
    ap_.add_argument("--session", action="store_true",
                     help="approve this exact call again, without asking, for the rest of the client session it "
                          "came in (its MCP connection), for that principal only")  # fmt: skip
    ap_.set_defaults(func=_cmd_approvals)
    au = sub.add_parser(
        "audit", help="verify, read and export the audit log",
        description="Exit codes of tail|show|query|calls: 0 printed, 1 nothing matched, 2 usage, 3 the log has "
        "lines that are not records. export: 0 done, 1 the sink did not take a batch, 2 usage or cursor, 3 unreadable "
        "lines (skipped). verify, replay: see docs/audit.md",
    )  # fmt: skip
    au.add_argument("action", choices=["verify", "repair", "head", "adopt", "tail", "show", "query", "calls", "export",
                                       "replay"])  # fmt: skip
    au.add_argument("call_id", nargs="?", help="for show: the call whose records to print")
    au.add_argument("--audit-dir", default="audit", help="the audit directory (default: %(default)s)")
    _store_option(au)
    au.add_argument(
        "--audit-keys", default=DEFAULT_AUDIT_KEYS, help="the signing key and checkpoints (default: %(default)s)"
    )
    au.add_argument("--key", action="append", help="verify: the public key to check with (default: the one in "
                    "--audit-keys, with a warning); again for each key the log has had")  # fmt: skip
    au.add_argument("--no-key", action="store_true", help="verify: check only consistency when there is no key")
    au.add_argument("--new-key", action="store_true", help="adopt: the log's key is gone: go on under a new one")
    au.add_argument("--checkpoint", action="append", help="verify: a checkpoint file (default: the gateway's own)")
    au.add_argument("--no-checkpoint", action="store_true", help="verify: check without one (truncation will not show)")
    au.add_argument("-n", type=int, default=20, help="tail: how many records (default: %(default)s)")
    au.add_argument("-f", "--follow", action="store_true", help="tail, export: keep going with new records")
    au.add_argument("--since", help="from this time on: 2026-11-25T10:00, 2026-11-25, 2h, 30m, 7d, today, yesterday")
    au.add_argument("--until", help="before this time (same forms as --since)")
    au.add_argument("--event", action="append", help="only these events (repeat or comma-separate: decision,result)")
    au.add_argument("--call", action="append", help="only these calls (and the parts they carried)")
    au.add_argument("--principal", help="only this principal's records")
    au.add_argument("--tool", help="only this tool's records (run, files, session, ...)")
    au.add_argument("--decision", choices=["allow", "ask", "deny"])
    au.add_argument("--rule", help="only records decided by this rule")
    au.add_argument("--host", help="only records naming this host (a fleet record's host, a network host)")
    au.add_argument("--text", help="only records holding this text (any field, case-insensitive)")
    au.add_argument("--format", choices=["text", "jsonl", "csv", "ecs", "ocsf", "otlp"], default="text",
                    help="how to print (default: %(default)s); export: jsonl (default), ecs, ocsf, otlp")  # fmt: skip
    au.add_argument("--json", action="store_true", help="the same as --format jsonl")
    au.add_argument("--records", action="store_true", help="calls: each call's records under its row")
    au.add_argument("--redact", action="append", metavar="PATTERN",
                    help="also redact values under names matching this regular expression (repeatable)")  # fmt: skip
    au.add_argument("--cursor", metavar="FILE", help="export: resume from, and keep, this position file")
    au.add_argument("--endpoint", help="export --format otlp: the OTLP/HTTP traces URL (default: OTEL_EXPORTER_OTLP_*)")
    au.add_argument("--arguments", action="store_true", help="export --format otlp: add gen_ai.tool.call.arguments")
    au.add_argument("--policy", help="replay: the draft policy to decide the recorded calls under")
    au.add_argument("--workspace", help="replay: the workspace the draft's roots resolve against (default: recorded)")
    au.add_argument("--max-rows", type=int, default=200, help="replay: changed calls shown (default: %(default)s)")
    au.add_argument("--max-calls", type=int, default=100_000, help="replay: calls replayed at most (%(default)s)")
    au.set_defaults(func=_cmd_audit)
    serve_common = _common_options(
        None, f"policy file (default: the profile's layer {PROFILE_POLICIES}/NAME.yaml, else {DEFAULT_POLICY})"
    )
    sv = sub.add_parser("serve", parents=[serve_common], help="serve the gateway to MCP clients (stdio or HTTP)")
    how = sv.add_mutually_exclusive_group(required=True)
    how.add_argument("--stdio", action="store_true", help="speak MCP on stdin/stdout (the client spawns the gateway)")
    how.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp")
    sv.add_argument("--policy-key", action="append", metavar="PUB",
                    help="with --store: serve the fleet's policy, signed with this key (repeatable)")  # fmt: skip
    sv.add_argument("--tokens", default=DEFAULT_TOKENS, help="HTTP: the bearer tokens file (default: %(default)s)")
    sv.add_argument("--allow-remote", action="store_true", help="HTTP: allow a non-loopback address (warns)")
    sv.add_argument("--approver", choices=["queue", "tty", "deny"], default="queue",
                    help="who answers ask decisions (default: %(default)s: `gateway approvals ...`)")  # fmt: skip
    sv.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="the approvals queue (default: %(default)s)")
    sv.add_argument(
        "--process-dir",
        default=DEFAULT_PROCESS_DIR,
        help="the gateway's state: background processes' records and logs go in DIR/processes (default: %(default)s)",
    )
    sv.add_argument("--approval-timeout", type=float, default=120.0, help="seconds a supervisor has to answer")
    sv.add_argument("--pending-after", type=float, default=5.0, help="seconds before an asked call returns pending")
    sv.add_argument("--grace", type=float, default=10.0, help="seconds running calls get at shutdown")
    front = FrontLimits()
    sv.add_argument(
        "--max-connections",
        type=int,
        default=front.max_connections,
        help="HTTP: open connections at most (default: %(default)s, at most half the descriptor limit)",
    )
    sv.add_argument(
        "--max-connections-per-peer",
        type=int,
        default=front.max_connections_per_peer,
        help="HTTP: open connections from one address at most (default: %(default)s)",
    )
    sv.add_argument(
        "--header-timeout",
        type=float,
        default=front.header_timeout_s,
        help="HTTP: seconds a connection has to send a request's headers (default: %(default)s)",
    )
    sv.add_argument(
        "--body-timeout",
        type=float,
        default=front.body_timeout_s,
        help="HTTP: seconds a request has to send its body after its headers (default: %(default)s)",
    )
    sv.add_argument(
        "--write-timeout",
        type=float,
        default=front.write_timeout_s,
        help="HTTP: seconds an answer may wait for its client to take 64 KiB of it (default: %(default)s)",
    )
    sv.add_argument(
        "--max-body",
        type=int,
        default=front.max_body_bytes,
        metavar="BYTES",
        help="HTTP: largest request body, answered 413 above it (default: %(default)s, 16 MiB)",
    )
    sv.add_argument(
        "--profile",
        default="gateway",
        metavar="NAME[,NAME...]",
        help="the tool set: gateway (default), methings, os, shell-plugin, terminal-interface, system-ops: a "
        "seed's own tool names and replies, over the same gate; without --policy, under the profile's shipped "
        "policy layer (docs/tools.md)",
    )
    sv.add_argument("--quickstart", action="store_true",
                    help="create the workspace and audit dirs, issue a fresh token, print how to connect")  # fmt: skip
    sv.set_defaults(func=_cmd_serve)
    us = sub.add_parser("upstream", help="upstream MCP servers: pinned tool definitions, drift, accepting it")
    us.add_argument("action", choices=["list", "diff", "accept"])
    us.add_argument("upstream", nargs="?", help="diff, accept: the upstream (as the policy names it)")
    us.add_argument("tool", nargs="?", help="diff, accept: the upstream's own name of the tool")
    us.add_argument("--process-dir", default=DEFAULT_PROCESS_DIR, help="the gateway's state (default: %(default)s)")
    us.add_argument("--audit-dir", default="audit", help="accept: the audit log (default: %(default)s)")
    us.add_argument("--audit-keys", default=DEFAULT_AUDIT_KEYS, help="accept: its signing key (default: %(default)s)")
    us.add_argument(
        "--sha256", help="accept: the pending definition's digest, as diff printed it (refused if it moved)"
    )
    us.add_argument("--by", help="accept: who accepts (default: the login name)")
    us.add_argument("--json", action="store_true", help="list: as JSON, with each diff")
    us.set_defaults(func=_cmd_upstream)
    tk = sub.add_parser("token", help="bearer tokens for HTTP clients (each maps to a principal) and supervisors")
    tk.add_argument("action", choices=["create", "list", "revoke"])
    tk.add_argument("token_id", nargs="?", help="for revoke: the token's id (see: gateway token list)")
    tk.add_argument("--principal", help="create: the principal the token acts as")
    tk.add_argument("--supervisor", metavar="NAME",
                    help="create: a supervisor's secret for the web console and its API")  # fmt: skip
    tk.add_argument("--metrics", metavar="NAME", help="create: a scraper's token for GET /metrics, and nothing else")
    tk.add_argument("--label", help="create: a note kept with the token")
    tk.add_argument("--tokens", default=DEFAULT_TOKENS, help="the tokens file (default: %(default)s)")
    _store_option(tk)
    tk.add_argument("--host", action="append", help="create --store: honoured only on this host (repeatable)")
    tk.add_argument("--policy", default=str(DEFAULT_POLICY), help="create: the policy naming the principal")
    tk.add_argument("--workspace", help=argparse.SUPPRESS)
    tk.set_defaults(func=_cmd_token)
    st = sub.add_parser("store", help="the fleet's store: init, migrate, status, checkpoint (docs/fleet.md)")
    st.add_argument("action", choices=["init", "migrate", "status", "checkpoint"])
    _store_option(st)
    st.add_argument("--json", action="store_true", help="status: as JSON")
    st.set_defaults(func=_cmd_store)
    dr = sub.add_parser("doctor", help="what this host enforces: bubblewrap, user namespaces, Landlock, cgroups")
    dr.add_argument("--json", action="store_true", help="print one JSON object with every item")
    dr.add_argument("--policy", help="also check what this policy requires of the host")
    dr.add_argument("--workspace", help=argparse.SUPPRESS)
    dr.set_defaults(func=_cmd_doctor)
    dm = sub.add_parser("daemon", parents=[common], help="the resident gateway agents' hooks ask (docs/hooks.md)")
    dm.add_argument("--socket", required=True, help="the Unix socket to listen on, in a directory of mode 0700")
    dm.add_argument("--allow-uid", type=int, action="append", help="another uid that may ask (default: only this one)")
    dm.add_argument("--idle-exit", type=float, default=3600.0,
                    help="seconds without a call before the daemon exits (0: never; default: %(default)s)")  # fmt: skip
    dm.add_argument("--deadline", type=float, help="seconds to decide a call before denying it (default: 10)")
    dm.add_argument("--no-sandbox", action="store_true",
                    help="no rewrite of shell calls into sandboxed runs: the agent runs every call itself")  # fmt: skip
    dm.add_argument("--metrics-file", metavar="PATH",
                    help="write the metrics (Prometheus text format) to PATH, e.g. for node_exporter's textfile "
                         "collector")  # fmt: skip
    dm.add_argument("--metrics-interval", type=float, default=15.0, help="seconds between writes (%(default)s)")
    dm.set_defaults(func=_cmd_daemon)
    sub.add_parser("hook", help="an agent's pre-tool-use hook: gateway hook claude-code|codex|gemini (docs/hooks.md); "
                   "gateway hook codex --check|--trust: will Codex run it")  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:2] == ["hook", "codex"] and ("--check" in args_list or "--trust" in args_list):
        # lazy: startup (each command imports what it uses)
        from gateway.hooks import codex

        return codex.main(args_list[2:])
    if args_list[:1] == ["hook"]:  # the per-call path: the thin client, nothing else imported
        # lazy: startup (each command imports what it uses)
        from gateway import hook_client

        return hook_client.main(args_list[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    verb = getattr(args, "verb", None)
    if extra and verb == "policy" and args.path is None and len(extra) == 1:
        args.path = extra[0]  # `gateway policy test --principal x PATH`: argparse leaves PATH over
    elif extra and verb in ("approvals", "audit") and args.call_id is None and len(extra) == 1 and extra[0][:1] != "-":
        # `approvals approve --state-dir D ID`: argparse takes the action and the (optional) id
        # together, before the options, and leaves the id over; options and id go in any order
        args.call_id = extra[0]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "command", None) and args.command[0] == "--":
        args.command = args.command[1:]
    try:
        code: int = args.func(args)
    except BrokenPipeError:
        # the reader went away (`gateway audit query ... | head`): as other CLIs, stop quietly;
        # stdout is pointed at /dev/null so the interpreter's final flush does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, as a shell reports a program killed by it
    return code


if __name__ == "__main__":
    sys.exit(main())
