"""Deciding an upstream tool call (gateway/stages/upstream_rules.py): the rules naming the tool, their
argument conditions at JSON pointers, the path jail, levels; and the policy errors an admin gets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.loader import PolicyError
from gateway.policy.schema import Policy
from gateway.policy.selftest import check_examples
from gateway.stages.upstream_rules import decide, pointer_get, visible

UPSTREAM = {"command": ["/usr/bin/true"]}


def rule(rid: str, decision: str, tool: str, *conditions: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"id": rid, "decision": decision, "justification": f"{rid} says so", "tool": tool,
            "arguments": list(conditions), **more}  # fmt: skip


RULES = [
    rule(
        "owner", "allow", "gh.create_issue", {"at": "/owner", "equals": "our-org"}, {"at": "/title", "max_length": 10}
    ),
    rule("labels", "allow", "gh.label", {"at": "/labels", "max_length": 2}, {"at": "/labels/0", "one_of": ["bug", 1]}),
    rule("strict", "allow", "gh.flag", {"at": "/on", "equals": True}),
    rule("branch", "allow", "gh.push", {"at": "/branch", "regex": "feature/[a-z0-9-]+"}),
    rule("no-main", "deny", "gh.push", {"at": "/force", "equals": True}),
    rule("optional", "allow", "gh.comment", {"at": "/body", "max_length": 5, "required": False}),
    rule("escaped", "allow", "gh.meta", {"at": "/a~1b/~0c", "equals": 1}),
    rule("read", "allow", "fs.read", {"at": "/path", "path": "read"}),
    rule("write", "allow", "fs.write", {"at": "/target/path", "path": "write"}),
    rule("merge-asks", "ask", "gh.merge"),
    rule("merge-ok", "allow", "gh.merge"),
    rule("admin-only", "allow", "gh.admin_*", min_level=5),
    rule("any-delete", "deny", "*.delete_*"),
    rule("deletes", "allow", "fs.delete_tmp"),
]


@pytest.fixture
def policy(tmp_path: Path) -> CompiledPolicy:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "protected").mkdir()
    (ws / "src" / "a.txt").write_text("a")
    (ws / "escape").symlink_to("/etc")
    data = {
        "version": 1,
        "home": "src",
        "principals": {"dev": {"roles": ["dev"]}, "ro": {"roles": ["ro"]}, "admin": {"roles": ["admin"]}},
        "roles": {
            "dev": {"level": 2, "read_roots": ["."], "write_roots": ["src"], "protected": ["src/keep"]},
            "ro": {"level": 1, "read_roots": ["."]},
            "admin": {"level": 5, "read_roots": ["."]},
        },
        "tools": {"upstream": {"allow_from": 2, "ask_from": 1}},
        "upstreams": {"gh": UPSTREAM, "fs": UPSTREAM},
        "rules": RULES,
    }
    return compile_policy(Policy.model_validate(data), tmp_path / "p.yaml", ws)


# (principal, tool, arguments, decision, rule, first reason's code, fragment of its message)
CASES: list[tuple[str, str, dict[str, Any], str, str | None, str, str]] = [
    # --- equals, max_length, missing values ------------------------------------------------------
    ("dev", "gh.create_issue", {"owner": "our-org", "title": "short"}, "allow", "owner", "allowed", ""),
    ("dev", "gh.create_issue", {"owner": "evil", "title": "short"}, "deny", None, "arguments_refused",
     'rule owner: /owner must equal "our-org" (got "evil")'),
    ("dev", "gh.create_issue", {"owner": "our-org", "title": "much too long"}, "deny", None, "arguments_refused",
     "/title has 13 characters, more than 10"),
    ("dev", "gh.create_issue", {"title": "t"}, "deny", None, "arguments_refused", "/owner is missing"),
    ("dev", "gh.create_issue", {"owner": ["our-org"], "title": "t"}, "deny", None, "arguments_refused", "must equal"),
    # --- lists, array indexes, one_of ------------------------------------------------------------
    ("dev", "gh.label", {"labels": ["bug"]}, "allow", "labels", "allowed", ""),
    ("dev", "gh.label", {"labels": [1, "x"]}, "allow", "labels", "allowed", ""),
    ("dev", "gh.label", {"labels": ["bug", "a", "b"]}, "deny", None, "arguments_refused", "3 items, more than 2"),
    ("dev", "gh.label", {"labels": ["wontfix"]}, "deny", None, "arguments_refused", "must be one of"),
    ("dev", "gh.label", {"labels": [True]}, "deny", None, "arguments_refused", "must be one of"),  # true is not 1
    # --- JSON types are compared as JSON ---------------------------------------------------------
    ("dev", "gh.flag", {"on": True}, "allow", "strict", "allowed", ""),
    ("dev", "gh.flag", {"on": 1}, "deny", None, "arguments_refused", "must equal true (got 1)"),
    ("dev", "gh.flag", {"on": "true"}, "deny", None, "arguments_refused", "must equal true"),
    # --- regex: RE2, the whole value -------------------------------------------------------------
    ("dev", "gh.push", {"branch": "feature/x-1"}, "allow", "branch", "allowed", ""),
    ("dev", "gh.push", {"branch": "main\nfeature/x"}, "deny", None, "arguments_refused", "must match"),
    ("dev", "gh.push", {"branch": "feature/x; rm -rf /"}, "deny", None, "arguments_refused", "must match"),
    ("dev", "gh.push", {"branch": 7}, "deny", None, "arguments_refused", "must be a string"),
    # --- a deny rule's conditions: it applies when they all hold ---------------------------------
    ("dev", "gh.push", {"branch": "feature/x", "force": True}, "deny", "no-main", "denied", "no-main says so"),
    ("dev", "gh.push", {"branch": "feature/x", "force": False}, "allow", "branch", "allowed", ""),
    # --- optional values and escaped pointers ----------------------------------------------------
    ("dev", "gh.comment", {}, "allow", "optional", "allowed", ""),
    ("dev", "gh.comment", {"body": "too long"}, "deny", None, "arguments_refused", "/body has 8"),
    ("dev", "gh.meta", {"a/b": {"~c": 1}}, "allow", "escaped", "allowed", ""),
    ("dev", "gh.meta", {"a": {"b": {"~c": 1}}}, "deny", None, "arguments_refused", "is missing"),
    # --- paths: jailed like a command's ----------------------------------------------------------
    ("dev", "fs.read", {"path": "src/a.txt"}, "allow", "read", "allowed", ""),
    ("dev", "fs.read", {"path": "~/a.txt"}, "allow", "read", "allowed", ""),
    ("dev", "fs.read", {"path": "/etc/passwd"}, "deny", None, "arguments_refused", "outside the read roots"),
    ("dev", "fs.read", {"path": "src/../../x"}, "deny", None, "arguments_refused", "outside the read roots"),
    ("dev", "fs.read", {"path": "escape/passwd"}, "deny", None, "arguments_refused", "/etc/passwd is outside"),
    ("dev", "fs.read", {"path": "/proc/self/environ"}, "deny", None, "arguments_refused", "/proc"),
    ("dev", "fs.read", {"path": "~root/x"}, "deny", None, "arguments_refused", "only ~"),
    ("dev", "fs.read", {"path": ""}, "deny", None, "arguments_refused", "must be a path"),
    ("dev", "fs.write", {"target": {"path": "src/new.txt"}}, "allow", "write", "allowed", ""),
    ("dev", "fs.write", {"target": {"path": "protected/x"}}, "deny", None, "arguments_refused", "outside the write"),
    ("dev", "fs.write", {"target": {"path": "src/keep/x"}}, "deny", None, "arguments_refused", "is protected"),
    ("dev", "fs.write", {"target": {"path": "src/.git/config"}}, "deny", None, "arguments_refused", ".git"),
    # --- the strictest matching rule, globs, levels ----------------------------------------------
    ("dev", "gh.merge", {}, "ask", "merge-asks", "ask", "merge-asks says so"),
    ("dev", "gh.admin_purge", {}, "deny", None, "arguments_refused", "rule admin-only needs level 5"),
    ("admin", "gh.admin_purge", {}, "allow", "admin-only", "allowed", ""),
    ("dev", "gh.delete_repo", {}, "deny", "any-delete", "denied", "any-delete says so"),
    ("dev", "fs.delete_tmp", {}, "deny", "any-delete", "denied", ""),  # a deny beats an allow
    ("dev", "gh.unheard_of", {}, "deny", None, "no_rule", "no rule names gh.unheard_of"),
    # --- the family: ask from level 1, nothing below ----------------------------------------------
    ("ro", "gh.create_issue", {"owner": "our-org", "title": "t"}, "ask", None, "tool_ask", "ask a supervisor"),
    ("ro", "gh.merge", {}, "ask", "merge-asks", "ask", ""),
    # --- an upstream the policy does not define ---------------------------------------------------
    ("dev", "gitlab.create_issue", {}, "deny", None, "unknown_upstream", "no upstream 'gitlab'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("who", "tool", "args", "decision", "rule_id", "code", "says"), CASES, ids=[f"{c[1]}-{c[3]}-{i}" for i, c in
                                                                                enumerate(CASES)]
)  # fmt: skip
def test_decisions(
    policy: CompiledPolicy, who: str, tool: str, args: dict[str, Any], decision: str, rule_id: str | None,
    code: str, says: str,
) -> None:  # fmt: skip
    upstream, _, name = tool.partition(".")
    got = decide(policy, who, upstream, name, args).decision
    assert (got.verdict.label, got.rule) == (decision, rule_id), got
    reasons = [r for r in got.reasons if r.code != "paths_checked"]
    assert reasons[0].code == code and says in " ".join(r.message for r in got.reasons), got


def test_the_upstream_gets_the_path_that_was_checked(policy: CompiledPolicy) -> None:
    d = decide(policy, "dev", "fs", "write", {"target": {"path": "~/../src/new.txt", "mode": 1}, "x": [1]})
    assert d.decision.verdict.label == "allow"
    assert d.arguments == {"target": {"path": str(policy.workspace / "src" / "new.txt"), "mode": 1}, "x": [1]}
    assert d.decision.reasons[-1].code == "paths_checked"


def test_the_gateways_own_records_are_refused_whatever_the_roots(policy: CompiledPolicy, tmp_path: Path) -> None:
    private = policy.workspace / "src" / "audit"
    private.mkdir()
    d = decide(policy, "dev", "fs", "read", {"path": "src/audit/x"}, private=(private,))
    assert d.decision.verdict.label == "deny" and "gateway's own records" in d.decision.reasons[0].message


def test_listing_shows_what_some_arguments_allow_and_hides_what_is_always_denied(policy: CompiledPolicy) -> None:
    assert visible(policy, "dev", "gh", "create_issue") and visible(policy, "dev", "gh", "merge")
    assert not visible(policy, "dev", "gh", "delete_repo") and not visible(policy, "dev", "gh", "unheard_of")
    assert not visible(policy, "dev", "gh", "admin_purge") and visible(policy, "admin", "gh", "admin_purge")
    assert not visible(policy, "dev", "gitlab", "create_issue")


def test_json_pointers() -> None:
    doc = {"a": [{"b": 1}], "c/d": {"~e": 2}, "": 3}
    assert pointer_get(doc, "") == (True, doc)
    assert pointer_get(doc, "/a/0/b") == (True, 1)
    assert pointer_get(doc, "/c~1d/~0e") == (True, 2)
    assert pointer_get(doc, "/") == (True, 3)
    for missing in ("/a/1", "/a/01", "/a/-", "/a/b", "/x", "/a/0/b/c"):
        assert pointer_get(doc, missing) == (False, None), missing


# --- what an admin is told -------------------------------------------------------------------------
def load(tmp_path: Path, text: str) -> CompiledPolicy:
    from gateway.policy.compile import load_policy

    f = tmp_path / "p.yaml"
    f.write_text(text)
    policy = load_policy(f, tmp_path)
    check_examples(policy)
    return policy


HEAD = "version: 1\nupstreams:\n  gh: {command: [/usr/bin/true]}\nrules:\n"
ERRORS = [
    (HEAD + "  - {id: a, decision: allow, justification: j, tool: gitlab.x}\n",
     "rules 'a': tool 'gitlab.x' names no upstream (defined: gh)"),
    (HEAD + "  - {id: a, decision: allow, justification: j, tool: gh.x, programs: [ls]}\n",
     "programs: a rule naming an upstream tool takes none of the command fields"),
    (HEAD + "  - {id: a, decision: allow, justification: j, tool: gh.x, arguments: [{at: owner, equals: 1}]}\n",
     "'owner' is not a JSON pointer"),
    (HEAD + "  - {id: a, decision: allow, justification: j, tool: gh.x, arguments: [{at: /owner}]}\n",
     "give a check"),
    (HEAD + "  - {id: a, decision: allow, justification: j, tool: gh.x, arguments: [{at: /b, regex: '(a)\\1'}]}\n",
     "RE2 syntax"),
    (HEAD + "  - {id: a, decision: ask, approval: client, justification: j, tool: gh.x}\n",
     "approval: 'client' is for commands"),
    (HEAD + "  - {id: a, decision: allow, justification: j, tool: gh.x, arguments: [{at: /o, equals: 1}],\n"
     "     examples: {match: ['gh.x {\"o\": 2}']}}\n", "/o must equal 1 (got 2)"),
    ("version: 1\nupstreams:\n  gh: {command: [x], network: true}\n", "needs a network in sandbox.network"),
    ("version: 1\nupstreams:\n  gh: {command: [x], url: 'https://a/mcp'}\n", "give either command"),
    ("version: 1\nupstreams:\n  gh: {url: 'https://a/mcp', env_from: [A]}\n", "env_from: only for a stdio server"),
    ("version: 1\nupstreams:\n  My__Server: {url: 'https://a/mcp'}\n", "no '__'"),
    ("version: 1\nupstreams:\n  a: {url: 'https://a/mcp', prefix: b}\n  b: {url: 'https://b/mcp'}\n",
     "prefix 'b' is also a's"),
    ("version: 1\nrules:\n  - {id: a, decision: allow, justification: j}\n",
     "rules[0].programs: this field is required"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "says"), ERRORS, ids=[e[1][:30] for e in ERRORS])
def test_policy_errors_say_what_to_fix(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(PolicyError) as exc:
        load(tmp_path, text)
    assert says in str(exc.value), str(exc.value)


def test_the_issues_example_loads_and_its_examples_are_checked(tmp_path: Path) -> None:
    policy = load(
        tmp_path,
        HEAD.replace("gh:", "github:")
        + "  - id: issues-in-our-repo\n    decision: allow\n    justification: our own repositories only\n"
        '    tool: "github.create_issue"\n'
        '    arguments: [{at: "/owner", equals: "our-org"}, {at: "/title", max_length: 200}]\n'
        "    examples:\n      match: ['github.create_issue " + json.dumps({"owner": "our-org", "title": "x"}) + "']\n"
        "      not_match: ['github.create_issue " + json.dumps({"owner": "them", "title": "x"}) + "']\n",
    )
    assert [r.id for r in policy.tool_rules] == ["issues-in-our-repo"]


def test_an_example_a_stricter_rule_decides_otherwise_fails_the_load(tmp_path: Path) -> None:
    """As for commands: an allow rule's example that a deny rule catches is not an example of it."""
    with pytest.raises(PolicyError, match="decides it deny"):
        load(
            tmp_path,
            HEAD
            + "  - {id: a, decision: allow, justification: j, tool: gh.x, examples: {match: ['gh.x {\"o\": 1}']}}\n"
            "  - {id: b, decision: deny, justification: j, tool: '*.x', arguments: [{at: /o, equals: 1}]}\n",
        )
