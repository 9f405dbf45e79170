"""Honest commands the gate refused, and their hostile twins (issue 26, classes 7-11), decided
by the real pipeline under two policies: the shipped one, and one a policy author wrote from
docs/policy.md's prose (no `accept_unknown` anywhere, a deny rule with `args`).

7. echo's words and printf's arguments after the format are never options; `$((...))` is a number.
8. An option's value that is a message, a name or a pattern is that value, substitution or not,
   when quoted (one word); an unquoted one may be split into options.
9. A literal directory followed by names printed at run time (`build/stamp-$(date +%s)`) lies
   under that directory.
10. A quoted producer pipeline (`"$(ls -1t out/*.txt | head -1)"`) is a producer.
11. A deny rule with `args` matches what its args say, never the bare program.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.selftest import load_checked

ALLOW, ASK, DENY = Verdict.ALLOW, Verdict.ASK, Verdict.DENY

AUTHOR = """
version: 1
principals: {agent: {roles: [dev]}}
roles: {dev: {level: 1, read_roots: ["."], write_roots: ["."], protected: [".git/hooks", "secrets"]}}
tools: {run: {allow_from: 1}}
rules:
  - id: print
    decision: allow
    justification: "Printing text; printf -v assigns a variable instead."
    programs: ["echo", "printf"]
    forbidden_options: ["-v"]
    examples: {match: ["echo hi"]}
  - id: read
    decision: allow
    justification: "Reading files."
    programs: ["cat", "head", "tail", "wc", "grep", "sort"]
    examples: {match: ["cat README.md"]}
  - id: git
    decision: allow
    justification: "Recording work with git."
    programs: ["git"]
    subcommands: ["add", "commit", "status", "log", "switch", "rev-parse"]
    examples: {match: ["git status"]}
  - id: find
    decision: allow
    justification: "Finding files, without actions."
    programs: ["find"]
    forbidden_options: ["-exec", "-execdir", "-ok", "-okdir", "-delete"]
    examples: {match: ["find . -name x"]}
  - id: date
    decision: allow
    justification: "The date."
    programs: ["date"]
    forbidden_options: ["-s", "--set", "-f", "--file", "-r", "--reference"]
    examples: {match: ["date +%s"]}
  - id: write
    decision: allow
    justification: "Making files."
    programs: ["touch", "mkdir", "cp"]
    path_args: {write: "all"}
    examples: {match: ["touch x"]}
  - id: list
    decision: allow
    justification: "Listing."
    programs: ["ls"]
    path_args: {read: "all"}
    examples: {match: ["ls src"]}
  - id: secrets
    decision: deny
    justification: "Environment files hold secrets."
    programs: ["cat", "ls", "head"]
    args: [".*\\\\.env"]
    examples: {match: ["cat .env"], not_match: ["cat README.md", "ls"]}
  - id: repl
    decision: deny
    justification: "An interpreter without a script reads code from its input."
    programs: ["python3"]
    args: []
    examples: {match: ["python3"], not_match: ["python3 x.py"]}
  - id: pip
    decision: deny
    justification: "No installs."
    programs: ["python3"]
    subcommands: ["-m"]
    first_arg: ["pip"]
    examples: {match: ["python3 -m pip install x"]}
"""


def workspace(root: Path) -> Path:
    ws = root / "ws"
    for d in ("src", "build", "out", "secrets", ".git/hooks"):
        (ws / d).mkdir(parents=True)
    for f in ("README.md", ".env", "out/a.txt", "out/b.txt", "src/app.py", "-n", "--help"):
        (ws / f).write_text("x\n")
    return ws


@pytest.fixture(scope="module")
def author(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    root = tmp_path_factory.mktemp("author")
    ws = workspace(root)
    (root / "policy.yaml").write_text(AUTHOR)
    return load_checked(root / "policy.yaml", ws)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    return load_checked(Path("policies/default.yaml"), workspace(tmp_path_factory.mktemp("shipped")))


def decide(policy: CompiledPolicy, text: str) -> Verdict:
    return evaluate(policy, text, "agent").decision.verdict


# (command, under the author's policy, under the shipped policy)
CASES = [
    # --- 7: echo and printf ----------------------------------------------------------------
    ('echo "Build $(date +%s)"', ALLOW, ALLOW),
    ("echo *", ALLOW, ALLOW),  # the workspace holds files named -n and --help: echo prints them
    ("touch x && echo *", ALLOW, ALLOW),  # a glob after a write: still echo's words
    ("printf '%s\\n' *", ALLOW, ALLOW),
    ("printf '%s\\n' \"$x\" -v", ALLOW, ALLOW),  # after the format, -v is an argument
    ("printf -v out '%s' x", DENY, ALLOW),  # before it, the option the author forbids
    ('printf "$fmt" /tmp', DENY, DENY),  # $fmt could be -vPATH
    ("printf * x", DENY, DENY),  # the glob is the format: it matches --help
    ("head -n $((N+1)) README.md", ALLOW, ALLOW),
    ("tail -n +$((N+1)) README.md", ALLOW, ALLOW),
    ("head -n $V README.md", DENY, DENY),  # V='1 /etc/passwd' splits
    ("head $((N)) README.md", DENY, DENY),  # a leading number may be -5, an option to head
    # --- 8: values that are messages, names, patterns --------------------------------------
    ('git commit -m "snapshot $(date +%s)"', ALLOW, ALLOW),
    ('git commit -m "$(cat README.md)"', ALLOW, ALLOW),
    ("git commit -F - <<EOF\nsnapshot $(date +%s)\nEOF", ALLOW, ALLOW),
    ('git switch -c "feature-$(date +%s)"', ALLOW, ALLOW),
    ('grep -e "$PAT" README.md', ALLOW, ALLOW),
    ("sort -t \"$(printf '\\t')\" -k2 README.md", ALLOW, ALLOW),
    ("git commit -m $msg", DENY, DENY),  # msg='x -S' runs gpg
    ('git commit -m "$(cat /etc/passwd)"', DENY, DENY),  # the substitution is decided as a command
    ('git commit -m "$(rm -rf src)"', DENY, ASK),
    # --- 9: names made at run time ---------------------------------------------------------
    ('touch "build/stamp-$(date +%s)"', ALLOW, ALLOW),
    ('mkdir -p "out/run-$(date +%Y%m%d-%H%M%S)"', ALLOW, ALLOW),
    ('cp README.md "build/README-$(git rev-parse --short HEAD).md"', ALLOW, ALLOW),
    ('echo done > "out/log-$(date +%F).txt"', ALLOW, ALLOW),
    ("touch out/run-$((n+1)).txt", ALLOW, ALLOW),
    ('touch "$(date +%s)"', ALLOW, ALLOW),  # beside .git: date prints no '.'
    ('touch "/tmp/stamp-$(date +%s)"', DENY, DENY),  # the directory is outside
    ('touch "../stamp-$(date +%s)"', DENY, DENY),
    ('touch ".git/hooks/pre-commit-$(date +%s)"', DENY, DENY),
    ('touch "build/$(date +%s)/../../../etc/x"', DENY, DENY),  # a `..` after the names
    ('touch "build/$(date +%D)"', DENY, DENY),  # %D prints mm/dd/yy: slashes
    ('touch "build/$(cat name.txt)"', DENY, DENY),  # cat prints anything
    ('touch "build/$(date +%s 2>&1)"', DENY, DENY),  # date's errors name files
    ('touch "$(date +.git%s)"', DENY, DENY),  # could spell .git
    ('touch "secre$(date +%s)"', ALLOW, ALLOW),  # never `secrets`: date prints digits
    ('touch "secret$(git rev-parse --short HEAD)"', ALLOW, ALLOW),  # hex, never an `s`
    ('touch "secre$(uname -s)"', DENY, ALLOW),  # could spell the author's protected `secrets`
    ("touch build/$(date +%s)", DENY, DENY),  # unquoted: split and globbed
    # --- 10: producer pipelines ------------------------------------------------------------
    ('tail -n 20 "$(ls -1t out/*.txt | head -1)"', ALLOW, ALLOW),
    ('cat "$(ls -1t out/*.txt | head -1)"', ALLOW, ALLOW),
    ('cat "$(find src -name "*.py" | head -1)"', ALLOW, ALLOW),
    ('cat "$(find .. -name x | head -1)"', DENY, DENY),
    ('cat "$(ls /etc/*.conf | head -1)"', DENY, DENY),
    ('cat "$(ls; cat /etc/hostname)"', DENY, DENY),
    # --- 11: deny rules with args ----------------------------------------------------------
    ("ls", ALLOW, ALLOW),
    ("cat", ALLOW, ALLOW),  # reads its input: no argument names a secret
    ("head -n 3", ALLOW, ALLOW),
    ("cat .env", DENY, DENY),  # the shipped policy: by its deny_read (issue 23)
    ("cat README.md .env", DENY, DENY),  # one matching argument is enough
    ("python3", DENY, DENY),
    ("python3 -m", DENY, DENY),  # no module: the interpreter reads its input
]


@pytest.mark.parametrize(("command", "by_author", "by_shipped"), CASES, ids=[c[0] for c in CASES])
def test_decisions(author: CompiledPolicy, shipped: CompiledPolicy, command: str, by_author: Verdict,
                   by_shipped: Verdict) -> None:  # fmt: skip
    assert decide(author, command) is by_author, evaluate(author, command, "agent").decision
    assert decide(shipped, command) is by_shipped, evaluate(shipped, command, "agent").decision


def test_a_deny_rule_with_args_names_itself_only_for_what_its_args_say(author: CompiledPolicy) -> None:
    assert evaluate(author, "cat .env", "agent").decision.rule == "secrets"
    assert evaluate(author, "python3 -m", "agent").decision.rule == "repl"  # not pip: it has no first argument
    assert evaluate(author, "python3 -m pip install x", "agent").decision.rule == "pip"
