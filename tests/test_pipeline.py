"""The decision pipeline on the shipped default policy: whole decisions (verdict, rule, reason
code) for honest agent commands and for attempts to get past the policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.selftest import load_checked


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("print(1)\n")
    (ws / "README.md").write_text("hi\n")
    return load_checked(Path("policies/default.yaml"), ws)


# (command, verdict, deciding rule or None, a reason code or None)
TABLE = [
    # --- honest commands: allowed ----------------------------------------------------------
    ("git status", "allow", "git-read", None),
    ("git log --oneline -n 20", "allow", "git-read", None),
    ("git diff HEAD~1 -- src/app.py", "allow", "git-read", None),
    ("git add -A && git commit -m 'fix: handle it'", "allow", "git-write", None),
    ("ls -la src", "allow", "inspect", None),
    ("cat README.md | head -n 5", "allow", "read-files", None),
    ("grep -rn TODO src/", "allow", "search", None),
    ("find . -name '*.py' -type f", "allow", "find", None),
    ("wc -l src/*.py", "allow", "read-files", None),
    ("mkdir -p src/pkg && touch src/pkg/__init__.py", "allow", "write-files", None),
    ("cp src/app.py src/app_copy.py", "allow", "copy-move", None),
    ("echo 'print(2)' > src/two.py", "allow", "builtins", None),
    ("make test 2>&1 | tail -20", "allow", "build", None),
    ("python -m pytest -x -q tests/", "allow", "python-modules", None),
    ("CI=1 npm test", "allow", "node-tools", None),
    ("timeout 60 pytest -q", "allow", "wrappers", None),
    ("cd src && ls", "allow", "cd", None),
    ("awk '{print $1}' README.md", "allow", "awk", None),
    ("export NODE_ENV=test && npm run build", "allow", "export", None),
    ("sort -u README.md | uniq -c", "allow", "sort", None),
    # bashlex cannot parse these; mvdan/sh confirms them (issue 13: they asked before)
    ("cat <<'EOF' > notes.md\nhello\nEOF", "allow", "read-files", None),
    ("[[ -f README.md ]] && echo yes", "allow", "builtins", None),
    # --- asks -------------------------------------------------------------------------------
    ("rm -rf src/pkg", "ask", "rm", "ask"),
    ("sed -i 's/a/b/' src/app.py", "allow", "sed", None),  # its script is parsed (gateway/programs/)
    ("python scripts/migrate.py", "ask", "python-script", "ask"),
    ("time ls | wc -l", "ask", None, "unconfirmed_unparsed"),  # neither bashlex nor mvdan/sh confirms
    # --- denied by a rule ---------------------------------------------------------------------
    ("curl https://example.com", "deny", "network", "denied"),
    ("git push origin main", "deny", "git-network", "denied"),
    ("git config core.pager 'sh -c id'", "deny", "git-config", "denied"),
    ("bash -c 'ls'", "deny", "shells", "denied"),
    ("python3 -c 'import os'", "deny", "interpreters-inline", "denied"),
    ("sudo rm -rf /", "deny", "privilege", "denied"),
    ("ls | sh", "deny", None, "shell_reads_stdin"),
    # --- no rule -----------------------------------------------------------------------------
    ("nmap localhost", "deny", None, "no_rule"),
    ("./evil.sh", "deny", None, "no_rule"),
    ("/tmp/ls", "deny", None, "no_rule"),
    ("git -c core.pager=sh log", "deny", None, "no_rule"),
    ("find . -exec rm {} \\;", "deny", None, "no_rule"),
    ("find . -delete", "deny", None, "no_rule"),
    ("sort -o /etc/x in", "deny", None, "outside_write_roots"),  # -o is a jailed write (sort's model)
    ("tree -o out.txt", "deny", None, "no_rule"),
    ("awk 'BEGIN{system(\"id\")}'", "deny", None, "no_rule"),
    ("GIT_SSH_COMMAND=x git status", "deny", None, "no_rule"),
    ("LD_PRELOAD=/tmp/x.so ls", "deny", None, "protected_variable"),
    ("export PAGER=less", "deny", None, "no_rule"),
    ("ls | xargs rm", "deny", None, "no_rule"),
    ("cat $FILE", "deny", None, "no_rule"),
    ("git diff --output=/tmp/x", "deny", None, "no_rule"),
    ("git branch -D main", "deny", None, "no_rule"),
    ("python -m http.server", "deny", None, "no_rule"),
    # --- the analyser refuses ---------------------------------------------------------------
    ('eval "$(echo rm)"', "deny", None, "forbidden_builtin"),
    ("$cmd -rf /", "deny", None, "dynamic_command_name"),
    ("echo `id`", "deny", None, "backtick_substitution"),
    # --- the jail -------------------------------------------------------------------------------
    ("cat /etc/passwd", "deny", None, "outside_read_roots"),
    ("echo x > /tmp/out", "deny", None, "outside_write_roots"),
    ("touch .git/hooks/pre-commit", "deny", None, "protected_path"),
    ("rm -rf /", "deny", None, "outside_write_roots"),  # deny beats the rm rule's ask
    ("cp /etc/shadow src/", "deny", None, "outside_read_roots"),
    ("cd / && cat etc/passwd", "deny", None, "outside_read_roots"),
    # --- one bad command in a chain denies the call ----------------------------------------------
    ("git status && curl https://x", "deny", "network", "denied"),
    ("ls; rm -rf src && nmap x", "deny", None, "no_rule"),
]


@pytest.mark.parametrize(("command", "verdict", "rule", "code"), TABLE, ids=[t[0][:50] for t in TABLE])
def test_decision(policy: CompiledPolicy, command: str, verdict: str, rule: str | None, code: str | None) -> None:
    decision = evaluate(policy, command, "agent").decision
    assert decision.verdict is Verdict.parse(verdict), decision
    if rule is not None:
        assert decision.rule == rule, decision
    if code is not None:
        assert code in [r.code for r in decision.reasons], decision.reasons
    assert decision.reasons or decision.verdict is Verdict.ALLOW


def test_a_denial_tells_the_agent_why(policy: CompiledPolicy) -> None:
    decision = evaluate(policy, "curl https://example.com", "agent").decision
    assert "Network tools are not available" in decision.reasons[0].message
    near = evaluate(policy, "sort --compress-program=sh in", "agent").decision
    assert "it runs the program 'sh'" in near.reasons[0].message


def test_unknown_principal_is_denied_not_an_error(policy: CompiledPolicy) -> None:
    decision = evaluate(policy, "ls", "mallory").decision
    assert decision.verdict is Verdict.DENY
    assert "unknown principal 'mallory'" in decision.reasons[0].message


def test_a_disabled_casbin_never_allows(policy: CompiledPolicy) -> None:
    policy.casbin._enforcer.enable_enforce(False)
    policy.casbin._memo.clear()
    try:
        decision = evaluate(policy, "git status", "agent").decision
        assert decision.verdict is Verdict.DENY
        assert decision.reasons[0].code == "internal_error"
        assert "disabled" in decision.reasons[0].message
    finally:
        policy.casbin._enforcer.enable_enforce(True)
