"""`gateway serve`: build the gateway from the command line and serve it (stdio or HTTP).

`--quickstart` (what `make serve` runs) also creates the policy's workspace and the audit
directory, issues a token for the policy's principal the first time (later starts keep using
it, and say which one and how to make another) and prints the URL and client configuration.

While it serves, the operator's terminal (stderr) hears what needs a person: a call that waits
for approval (and the command that answers it), a policy edit that was rejected (and why, with
its file and line), the audit log turning unwritable (and writable again).
"""

import argparse
import contextlib
import gc
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gateway import approval_queue, tokens
from gateway.approval import ApprovalRequest, Approver, DenyAll, TerminalApprover, escaped, shortened
from gateway.audit import AuditUnavailable
from gateway.audit.metered import meter
from gateway.audit.sink import AuditSink
from gateway.defaults import DEFAULT_POLICY, DEFAULT_STATE_DIR, DEFAULT_TOKENS, PROFILE_POLICIES
from gateway.pipeline import Gateway
from gateway.policy.layers import MAX_INCLUDE_DEPTH
from gateway.policy.loader import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.policy.selftest import load_checked
from gateway.sandbox.identity import IdentityUnavailable, hand_over
from gateway.server.app import GatewayServer
from gateway.server.limits import FrontLimits
from gateway.server.profiles import GATEWAY, ProfileError, specs_for
from gateway.server.run import listen_socket, serve_http, serve_stdio
from gateway.store.commands import (
    commit_timeout_of,
    dsn_of,
    fleet_approver,
    fleet_policy,
    fleet_tokens,
    spool_dirs,
    spool_of,
)
from gateway.store.ledger import open_sink
from gateway.store.policy import RolloutError

EXIT_USAGE = 2


def _fail(message: str) -> int:
    print(f"gateway serve: {message}", file=sys.stderr)
    return EXIT_USAGE


def _workspace_of(policy_file: Path, depth: int = 0) -> Path | None:
    """The workspace a policy names (relative to the file that names it: the file itself, else
    the last of its includes that does, as layering picks it), read before the policy is loaded."""
    try:
        raw = yaml.safe_load(policy_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None  # loading reports it properly
    if not isinstance(raw, dict):
        return None
    where = raw.get("workspace")
    if isinstance(where, str):
        return (policy_file.parent / where).resolve()
    includes = raw.get("include")
    if depth >= MAX_INCLUDE_DEPTH or not isinstance(includes, list):
        return None
    found = [_workspace_of(policy_file.parent / str(i), depth + 1) for i in includes]
    return next((w for w in reversed(found) if w is not None), None)


def policy_for(profile: str) -> tuple[Path, str | None]:
    """The policy `serve --profile` takes when no --policy is given, and a line for the operator:
    the shipped layer of the one profile served (`policies/profiles/NAME.yaml`, which includes the
    default policy), else the default policy."""
    names = [n for n in dict.fromkeys(n.strip() for n in profile.split(",")) if n and n != GATEWAY]
    shipped = [PROFILE_POLICIES / f"{n}.yaml" for n in names if (PROFILE_POLICIES / f"{n}.yaml").is_file()]
    if len(names) == 1 and shipped:
        return shipped[0], None
    if len(shipped) > 1 or (shipped and len(names) > 1):
        return DEFAULT_POLICY, (
            f"the profiles {', '.join(names)} ship a policy layer each ({', '.join(map(str, shipped))}); serving "
            f"{DEFAULT_POLICY}: pass --policy FILE, a layer that includes the ones you want"
        )
    return DEFAULT_POLICY, None


def say(message: str) -> None:
    """One line for the operator, on the server's stderr."""
    print(f"gateway serve: {message}", file=sys.stderr, flush=True)


def _waiting(args: argparse.Namespace) -> Callable[[ApprovalRequest, float], None]:
    """The line printed when a call starts waiting for a supervisor, with how to answer it."""
    where = "" if args.state_dir == DEFAULT_STATE_DIR else f" --state-dir {shlex.quote(args.state_dir)}"

    def tell(request: ApprovalRequest, timeout: float) -> None:
        console = f"http://{args.http}/console/" if getattr(args, "http", None) else ""  # its port bound by now
        command = shortened(escaped(request.command), 60, f"approvals show {request.call_id}")
        rule = f"rule {request.rule}" if request.rule else "the policy"
        say(
            f"call {request.call_id} waits for approval ({escaped(request.principal)}, {request.tool}, {rule}, "
            f"{int(timeout)} s): {command}\n"
            f"  answer: gateway approvals show{where} {request.call_id}   then approve{where} {request.call_id}"
            f"   or deny{where} {request.call_id} --reason ..."
            + (f"\n  or in the console: {console}" if console else "")
        )

    return tell


def _policy_event(audit: AuditSink, started: list[bool]) -> Callable[[str, dict[str, Any]], None]:
    """Record policy loads and rejections, and tell the operator about edits after the start."""

    def record(kind: str, data: dict[str, Any]) -> None:  # policy_loaded / policy_rejected
        audit.append(kind, data=data)
        if not started:
            return
        if kind == "policy_rejected":
            say(f"policy edit rejected, the policy in force is unchanged: {escaped(str(data.get('error')))}")
        elif kind == "policy_loaded":
            say(f"policy reloaded: {data.get('path')} (sha256 {str(data.get('sha256'))[:16]})")

    return record


def _audit_health(error: str | None) -> None:
    if error is None:
        say("the audit log is writable again")
    else:
        say(f"the audit log cannot be written, every call is denied until it can: {escaped(error)}")


def _watch_policy(holder: PolicyHolder) -> None:
    """Look at the policy files every second, so an edit is taken (or its rejection reported)
    when it is made, not at the next call."""

    def loop() -> None:
        while True:
            time.sleep(holder.interval)
            with contextlib.suppress(Exception):  # a check that fails is tried again
                holder.current()

    threading.Thread(target=loop, name="policy-watch", daemon=True).start()


def _approver(args: argparse.Namespace, write_roots: tuple[Path, ...], audit: AuditSink) -> Approver:
    if args.approver == "tty":
        try:  # stdin may be the MCP stream: talk to the controlling terminal itself
            tty_in = open("/dev/tty", encoding="utf-8")  # noqa: SIM115 (lives as long as the server)
            tty_out = open("/dev/tty", "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise PolicyError(f"--approver tty needs a terminal: /dev/tty: {exc.strerror}") from None
        return TerminalApprover(os.environ.get("USER", "supervisor"), tty_in, tty_out)
    fleet = fleet_approver(audit, say) if args.approver == "queue" else None
    if fleet is not None:  # --store: the fleet's inbox, answered from any host
        return fleet
    if args.approver == "queue":
        try:
            return approval_queue.QueueApprover(Path(args.state_dir), write_roots, on_wait=_waiting(args))
        except approval_queue.QueueError as exc:
            raise PolicyError(str(exc)) from None
    return DenyAll()


def main(args: argparse.Namespace) -> int:
    try:
        specs = specs_for(args.profile)
    except ProfileError as exc:
        return _fail(str(exc))
    if args.policy is None:
        chosen, note = policy_for(args.profile)
        args.policy = str(chosen)
        if note:
            say(note)
    try:  # --store with --policy-key: the fleet's signed policy, not the local file
        sync = fleet_policy(args, Path(args.process_dir) / "policy", say)
    except RolloutError as exc:
        return _fail(str(exc))
    policy_file = (sync.entry() if sync else None) or Path(args.policy)
    workspace = Path(args.workspace) if args.workspace else None
    host, port = "", 0
    if args.http:
        host, _, port_text = args.http.rpartition(":")
        host = host.strip("[]")
        if not host or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
            return _fail(f"--http {args.http}: expected HOST:PORT, e.g. 127.0.0.1:8765 (port 0: a free one)")
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
        # its appends measured for /metrics (gateway/audit/metered.py: counters, nothing waits)
        dsn = dsn_of(args)  # the fleet's store (--store, AGW_STORE), else the files of --audit-dir
        keys, spooled, bound = Path(args.audit_keys), spool_of(args), commit_timeout_of(args)
        audit = meter(
            open_sink(dsn, Path(args.audit_dir), keys, first.policy.audit.redact, spool=spooled, commit_timeout=bound)
        )
        audit.on_health = _audit_health
        started: list[bool] = []  # set once serving: edits from then on are reported
        holder = PolicyHolder(policy_file, workspace, on_event=_policy_event(audit, started))
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
        approver = _approver(args, writes, audit)
    except (PolicyError, AuditUnavailable, OSError) as exc:
        return _fail(str(exc))
    tokens_file = Path(args.tokens).absolute()
    gateway = Gateway(
        holder.current,
        audit,
        approver,
        approval_timeout_s=args.approval_timeout,
        hidden=(tokens_file.parent, Path(args.audit_keys), *spool_dirs(args)),
        state_dir=Path(args.process_dir),
        admit=sync.admission(holder.current) if sync else None,  # the fleet's policy: refused past its max age
    )
    unsafe = [gateway.unsafe_setup(policy, p) for p in policy.grants]
    if any(unsafe):
        return _fail(next(u for u in unsafe if u))
    # what start-up made (modules, the compiled policy, the SDK's models) lives as long as the
    # server: kept out of the cyclic collector's passes, which otherwise walk all of it each
    # time the oldest generation is collected (about 0.1 ms of every call under load)
    gc.freeze()
    if args.stdio:
        server = GatewayServer(gateway, principal, pending_after_s=args.pending_after, specs=specs)
        started.append(True)
        _watch_policy(holder)
        if sync is not None:  # new revisions land in its directory; the watch above takes them
            sync.start()
        return serve_stdio(server, args.grace)
    try:  # the port first: a start that cannot listen changes no token and records nothing
        sock = listen_socket(host, port, args.allow_remote)
    except (OSError, ValueError) as exc:
        gateway.close()
        return _fail(str(exc))
    port = sock.getsockname()[1]  # port 0: the kernel's choice, printed in the listening line
    args.http = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    token: str | None = None
    kept: tokens.TokenEntry | None = None
    try:
        fleet = fleet_tokens(audit)  # --store: the fleet's tokens, not the file's
        store = fleet or tokens.TokenStore(tokens_file)
        if args.quickstart and fleet is not None:
            sock.close()
            return _fail("--quickstart is for one host: with --store, make tokens with `gateway token create --store`")
        if args.quickstart:
            who = principal or (next(iter(policy.grants)) if len(policy.grants) == 1 else None)
            if who is None:
                sock.close()
                return _fail("--quickstart: the policy defines several principals: pass --principal")
            token, kept = tokens.quickstart(tokens_file, who)
    except tokens.TokenError as exc:
        sock.close()
        return _fail(str(exc))
    if store.error:
        sock.close()
        return _fail(store.error)

    def ready(url: str) -> None:
        print(
            f"gateway serve: listening on {url} (policy {policy_file}, audit {args.audit_dir}, profile {args.profile})",
            file=sys.stderr,
        )
        if args.quickstart and kept is not None:
            key = audit.key.public.fingerprint if audit.key else "none"
            _print_quickstart(url, token, kept, str(who), args, key)
        started.append(True)
        _watch_policy(holder)
        if sync is not None:  # new revisions land in its directory; the watch above takes them
            sync.start()
        sys.stderr.flush()

    return serve_http(
        gateway, store, host, port, grace_s=args.grace, allow_remote=args.allow_remote, ready=ready, limits=limits,
        sock=sock, specs=specs,
    )  # fmt: skip


def _print_quickstart(
    url: str, token: str | None, entry: tokens.TokenEntry, principal: str, args: argparse.Namespace, key: str
) -> None:
    shown = token or "agw_..."
    desktop = {"mcpServers": {"agent-gateway": {"type": "http", "url": url,
                                                "headers": {"Authorization": f"Bearer {shown}"}}}}  # fmt: skip
    claude_json = json.dumps(desktop)
    tokens_opt = "" if args.tokens == DEFAULT_TOKENS else f" --tokens {shlex.quote(args.tokens)}"
    another = f"gateway token create --principal {principal}{tokens_opt}"
    if token is not None:
        which = (
            f"token:  {token}      (shown once: only its hash is kept)\n"
            f"          this is the quickstart token {entry.id}; later starts keep using it"
        )
    else:
        which = (
            f"token:  the quickstart token {entry.id}, made {entry.created}, is still in use (it was shown\n"
            f"          once, when it was made: only its hash is kept). Lost it? `{another}` makes\n"
            f"          another; `gateway token revoke {entry.id}{tokens_opt}` retires this one\n"
            f"          (the next start then makes a new one)"
        )
    print(
        f"""
  agent-gateway is serving the policy {args.policy} as principal {principal!r}.
  URL:    {url}
  {which}
  Another token (one per client is best): {another}

  Only the gateway's tools: the clients' own shell and file tools bypass the policy
  (docs/serve.md#clients-the-gateway-as-the-only-path).
  Codex:         export AGW_TOKEN={shown}   (in every shell that runs codex)
                 and in ~/.codex/config.toml:
                   web_search = "disabled", sandbox_mode = "read-only", approval_policy = "never",
                   [features] shell_tool = false, goals = false, view_image = false,
                   [tools.experimental_request_user_input] enabled = false,
                   [mcp_servers.agent-gateway] url = "{url}", bearer_token_env_var = "AGW_TOKEN",
                   required = true, default_tools_approval_mode = "approve"
  Claude Code:   claude --tools "" --strict-mcp-config --allowedTools mcp__agent-gateway \\
                   --mcp-config '{claude_json}'
  Check:         codex features list | grep -E "shell_tool|view_image"   says false
                 claude ...the flags above... -p ok --output-format stream-json --verbose | head -1
                   lists "tools": mcp__agent-gateway__* only
  JSON config (Claude Desktop via mcp-remote, Cursor, VS Code take the same block):
    {json.dumps(desktop)}

  Approve asks:  gateway approvals list / gateway approvals approve CALL_ID (calls that wait are announced here)
  Web console:   {url.removesuffix("/mcp")}/console/
                 (sign in with a secret from: gateway token create --supervisor NAME{tokens_opt})
  Read the log:  gateway audit tail -f --audit-dir {args.audit_dir}
  Audit key:     {key}
                 records are signed: copy {args.audit_keys}/signing.pub off this machine,
                 then check the log any time with: gateway audit verify --key signing.pub
""",
        file=sys.stderr,
    )
