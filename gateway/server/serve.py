"""`gateway serve`: build the gateway from the command line and serve it (stdio or HTTP).

`--quickstart` (what `make serve` runs) also creates the policy's workspace and the audit
directory, issues a fresh token for the policy's principal (replacing the previous quickstart
token) and prints the URL, the token and client configuration to copy.
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway import approval_queue
from gateway.approval import Approver, DenyAll, TerminalApprover
from gateway.audit import AuditUnavailable, open_signed
from gateway.pipeline import Gateway
from gateway.policy.loader import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.policy.selftest import load_checked
from gateway.sandbox.identity import IdentityUnavailable, hand_over
from gateway.server import tokens
from gateway.server.app import GatewayServer
from gateway.server.limits import FrontLimits
from gateway.server.run import serve_http, serve_stdio

EXIT_USAGE = 2


def _fail(message: str) -> int:
    print(f"gateway serve: {message}", file=sys.stderr)
    return EXIT_USAGE


def _workspace_of(policy_file: Path) -> Path | None:
    """The workspace a policy names (relative to its file), read before the policy is loaded."""
    try:
        raw = yaml.safe_load(policy_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None  # loading reports it properly
    where = raw.get("workspace") if isinstance(raw, dict) else None
    return (policy_file.parent / where).resolve() if isinstance(where, str) else None


def _approver(args: argparse.Namespace, write_roots: tuple[Path, ...]) -> Approver:
    if args.approver == "tty":
        try:  # stdin may be the MCP stream: talk to the controlling terminal itself
            tty_in = open("/dev/tty", encoding="utf-8")  # noqa: SIM115 (lives as long as the server)
            tty_out = open("/dev/tty", "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise PolicyError(f"--approver tty needs a terminal: /dev/tty: {exc.strerror}") from None
        return TerminalApprover(os.environ.get("USER", "supervisor"), tty_in, tty_out)
    if args.approver == "queue":
        try:
            return approval_queue.QueueApprover(Path(args.state_dir), write_roots)
        except approval_queue.QueueError as exc:
            raise PolicyError(str(exc)) from None
    return DenyAll()


def main(args: argparse.Namespace) -> int:
    policy_file = Path(args.policy)
    workspace = Path(args.workspace) if args.workspace else None
    host, port = "", 0
    if args.http:
        host, _, port_text = args.http.rpartition(":")
        host = host.strip("[]")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return _fail(f"--http {args.http}: expected HOST:PORT, e.g. 127.0.0.1:8765")
        port = int(port_text)
    limits = FrontLimits(
        max_connections=args.max_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        write_timeout_s=args.write_timeout,
        max_body_bytes=args.max_body,
    )
    if args.http and limits.problems():
        return _fail("; ".join(limits.problems()))
    if args.quickstart:
        for d in (workspace or _workspace_of(policy_file), Path(args.audit_dir)):
            if d is not None:
                d.mkdir(parents=True, exist_ok=True)
        ws = workspace or _workspace_of(policy_file)
        if ws is not None:  # the quick start's workspace is the agent's: its sandbox account owns it
            try:
                hand_over(ws)
            except (OSError, IdentityUnavailable) as exc:
                return _fail(f"cannot give {ws} to the sandbox's account: {exc}")
    try:
        first = load_checked(policy_file, workspace)  # for the audit settings; the holder keeps it current
        audit = open_signed(Path(args.audit_dir), Path(args.audit_keys), redact=first.policy.audit.redact)

        def record(kind: str, data: dict[str, Any]) -> None:  # policy_loaded / policy_rejected
            audit.append(kind, data=data)

        holder = PolicyHolder(policy_file, workspace, on_event=record)
        policy = holder.current()
        principal = args.principal
        if args.stdio and not principal:
            if len(policy.grants) != 1:
                names = ", ".join(sorted(policy.grants))
                return _fail(f"the policy defines several principals ({names}): pass --principal for stdio")
            principal = next(iter(policy.grants))
        if principal is not None and principal not in policy.grants:
            return _fail(f"{policy_file}: no principal {principal!r} (defined: {', '.join(sorted(policy.grants))})")
        writes = tuple({r for g in policy.grants.values() for r in g.write_roots})
        approver = _approver(args, writes)
    except (PolicyError, AuditUnavailable, OSError) as exc:
        return _fail(str(exc))
    tokens_file = Path(args.tokens).absolute()
    gateway = Gateway(
        holder.current,
        audit,
        approver,
        approval_timeout_s=args.approval_timeout,
        hidden=(tokens_file.parent, Path(args.audit_keys)),
        state_dir=Path(args.process_dir),
    )
    unsafe = [gateway.unsafe_setup(policy, p) for p in policy.grants]
    if any(unsafe):
        return _fail(next(u for u in unsafe if u))
    if args.stdio:
        server = GatewayServer(gateway, principal, pending_after_s=args.pending_after)
        return serve_stdio(server, args.grace)
    try:
        store = tokens.TokenStore(tokens_file)
        if args.quickstart:
            who = principal or (next(iter(policy.grants)) if len(policy.grants) == 1 else None)
            if who is None:
                return _fail("--quickstart: the policy defines several principals: pass --principal")
            token, _ = tokens.create(tokens_file, who, "quickstart", replace_label=True)
    except tokens.TokenError as exc:
        return _fail(str(exc))
    if store.error:
        return _fail(store.error)

    def ready(url: str) -> None:
        print(f"gateway serve: listening on {url} (policy {policy_file}, audit {args.audit_dir})", file=sys.stderr)
        if args.quickstart:
            _print_quickstart(url, token, str(who), args, audit.key.public.fingerprint if audit.key else "none")
        sys.stderr.flush()

    return serve_http(
        gateway, store, host, port, grace_s=args.grace, allow_remote=args.allow_remote, ready=ready, limits=limits
    )


def _print_quickstart(url: str, token: str, principal: str, args: argparse.Namespace, key: str) -> None:
    desktop = {"mcpServers": {"agent-gateway": {"type": "http", "url": url,
                                                "headers": {"Authorization": f"Bearer {token}"}}}}  # fmt: skip
    print(
        f"""
  agent-gateway is serving the policy {args.policy} as principal {principal!r}.
  URL:    {url}
  token:  {token}      (shown once; `make serve` issues a new one each start)

  Claude Code:   claude mcp add --transport http agent-gateway {url} --header "Authorization: Bearer {token}"
  JSON config (Claude Desktop via mcp-remote, Cursor, VS Code take the same block):
    {json.dumps(desktop)}

  Approve asks:  gateway approvals list / gateway approvals approve CALL_ID
  Read the log:  gateway audit tail -f --audit-dir {args.audit_dir}
  Audit key:     {key}
                 records are signed: copy {args.audit_keys}/signing.pub off this machine,
                 then check the log any time with: gateway audit verify --key signing.pub
""",
        file=sys.stderr,
    )
