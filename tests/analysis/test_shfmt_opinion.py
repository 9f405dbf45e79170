"""mvdan/sh (shfmt) confirms where bashlex is blind, denies where it reads the text differently,
and never allows by itself when it is missing, killed or slow (issue 13, class 7).

Before: every line below that bashlex could not confirm waited for a human under the shipped
policy (`second_opinion.unconfirmed: ask`), and a text whose primary reading was wrong behind a
bashlex blind spot was only asked about.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gateway.analysis import OpinionStatus, analyze, primary, shfmt
from gateway.analysis.analyzer import cache as analysis_cache
from gateway.analysis.second_opinion import compare_exact
from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.selftest import load_checked


@pytest.fixture
def policy(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    """The shipped policy, compiled for each test: its decision cache starts empty."""
    ws = tmp_path_factory.mktemp("ws")
    (ws / "src").mkdir()
    (ws / "README.md").write_text("hello\n")
    return load_checked(Path("policies/default.yaml"), ws)


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    """Each test sees shfmt asked anew: no parse and no analysis kept from another test."""
    shfmt.cache.clear()
    analysis_cache.clear()


def decided(policy: CompiledPolicy, text: str) -> Verdict:
    return evaluate(policy, text, "agent").decision.verdict


# --- honest lines bashlex cannot confirm: confirmed now, allowed under the shipped policy -------
HONEST = [
    "cat <<'EOF' > notes.txt\nhello $USER, $(not run)\nEOF",  # quoted here-documents
    'cat > src/x.py <<"EOF"\nprint("a\\tb")\nEOF',
    "cat <<\\EOF > notes.txt\nx\nEOF",
    'printf "%d items\\n" 3',  # backslashes in double quotes
    'echo -e "a\\tb"',
    'grep -n "def \\(foo\\)" README.md',
    "echo $((1 + 2))",  # arithmetic expansion
    "i=0; i=$((i + 1)); echo $i",
    "[[ -f README.md ]] && echo yes",  # [[ ]], case, for (( )), arrays
    'case "$1" in -h) echo help;; *) ls;; esac',
    "for ((i = 0; i < 3; i++)); do echo $i; done",
    "files=(a b); echo ${#files[@]}",
    "echo \"a\"'b'",  # quote removal after a quoted part
    "echo ${HOME:-$(pwd)}",  # a substitution inside ${...}
    'echo "é \\(x\\) ü"',  # non-ASCII: mvdan/sh counts bytes, the comparison characters
]


@pytest.mark.parametrize("text", HONEST, ids=[h[:40] for h in HONEST])
def test_honest_line_bashlex_cannot_confirm_is_confirmed_and_allowed(policy: CompiledPolicy, text: str) -> None:
    result = analyze(text, use_cache=False)
    assert result.denial is None
    assert result.second_opinion.status is OpinionStatus.CONFIRMED_BY_SHFMT, result.second_opinion
    assert result.second_opinion.confirmed and result.second_opinion.shfmt == "agreed"
    assert "bashlex " in result.second_opinion.detail  # what bashlex said stays on the record
    assert decided(policy, text) is Verdict.ALLOW


def test_echo_e_with_single_quotes_needs_no_confirmation() -> None:
    assert analyze("echo -e 'a\\tb'", use_cache=False).second_opinion.status is OpinionStatus.AGREED


def test_a_bash_c_script_is_confirmed_too(policy: CompiledPolicy) -> None:
    result = analyze("bash -c 'echo $((6 * 7))'", use_cache=False)
    assert result.denial is None and result.second_opinion.status is OpinionStatus.CONFIRMED_BY_SHFMT


# --- a primary misreading behind a bashlex blind spot is denied -----------------------------------
MISREAD = [
    # tree-sitter drops the command `{}` (bash runs a program of that name); bashlex stops at `[[`
    ("{}; [[ -f x ]]", "mvdan/sh sees a command ['{}'] at offset 0 that tree-sitter does not"),
    # tree-sitter takes the descriptor `0` of `0<&3` for cat's argument
    ("[[ -t 0 ]] && cat 0<&3", "command at offset 14: mvdan/sh reads [(14, 17, 'cat')]"),
    ("case x in x) cat 0<&3;; esac", "command at offset 13"),
]


@pytest.mark.parametrize(("text", "detail"), MISREAD, ids=[m[0] for m in MISREAD])
def test_a_disagreement_with_mvdan_sh_is_a_denial(policy: CompiledPolicy, text: str, detail: str) -> None:
    result = analyze(text, use_cache=False)
    assert result.denial is not None and result.denial.code == "parser_disagreement"
    assert detail in result.denial.message
    assert result.second_opinion.status is OpinionStatus.DISAGREED and result.second_opinion.shfmt == "disagreed"
    assert "shfmt" in result.denial.details and "tree_sitter" in result.denial.details
    assert decided(policy, text) is Verdict.DENY


# --- crafted trees: the vocabulary is closed and the comparison exact ----------------------------
def tree_of(text: str) -> dict[str, object]:
    binary = shfmt.binary()
    assert binary is not None, "the shfmt-py package is a dependency"
    out = subprocess.run([binary, "-ln", "bash", "--to-json"], input=text.encode(), capture_output=True, check=True)
    tree: dict[str, object] = json.loads(out.stdout)
    return tree


def fake_shfmt(tmp_path: Path, body: str) -> str:
    path = tmp_path / "shfmt"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def serving(tmp_path: Path, tree: object) -> str:
    """A stand-in shfmt that prints `tree` whatever it is asked."""
    (tmp_path / "tree.json").write_text(json.dumps(tree))
    return fake_shfmt(tmp_path, f"cat > /dev/null; cat {tmp_path / 'tree.json'}")


TEXT = 'printf "%d items\\n" 3'  # bashlex: partial, so shfmt is asked


def crafted(change: str) -> object:
    tree = tree_of(TEXT)
    cmd = tree["Stmts"][0]["Cmd"]  # type: ignore[index]
    if change == "unknown node":
        cmd["Type"] = "FutureClause"
    elif change == "other dialect's field":
        tree["Stmts"][0]["Coprocess"] = True  # type: ignore[index]
    elif change == "unknown field":
        cmd["Args"][0]["Parts"][0]["Raw"] = "printf"
    elif change == "another word":
        cmd["Args"][2]["Parts"][0]["Value"] = "4"
    elif change == "a word less":
        del cmd["Args"][2]
    elif change == "a command more":
        tree["Stmts"].append(tree_of(" " * 19 + "3")["Stmts"][0])  # type: ignore[attr-defined,index]
    return tree


CHANGES = ["unknown node", "other dialect's field", "unknown field", "another word", "a word less", "a command more"]


@pytest.mark.parametrize("change", CHANGES)
def test_a_crafted_tree_that_differs_is_denied(
    policy: CompiledPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    fake = serving(tmp_path, crafted(change))
    monkeypatch.setattr(shfmt, "binary", lambda: fake)
    result = analyze(TEXT, use_cache=False)
    assert result.denial is not None and result.denial.code == "parser_disagreement", result.second_opinion
    assert decided(policy, TEXT) is Verdict.DENY


def test_the_unchanged_tree_confirms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = serving(tmp_path, crafted("nothing"))
    monkeypatch.setattr(shfmt, "binary", lambda: fake)
    assert analyze(TEXT, use_cache=False).second_opinion.status is OpinionStatus.CONFIRMED_BY_SHFMT


def test_the_comparison_wants_every_word_at_its_place() -> None:
    walk = primary.walk("ls -la src")
    same = ((0, 2, "ls"), (3, 6, "-la"), (7, 10, "src"))
    assert compare_exact(walk, (same,)) == []
    moved = ((0, 2, "ls"), (3, 6, "-la"), (8, 11, "src"))
    assert compare_exact(walk, (moved,))
    assert compare_exact(walk, ())
    assert compare_exact(walk, (same, ((11, 13, "rm"),)))


# --- no confirmation from a missing, killed, slow or flooding shfmt -------------------------------
def unconfirmed(policy: CompiledPolicy, shfmt_status: str) -> None:
    result = analyze(TEXT, use_cache=False)
    assert result.denial is None
    assert result.second_opinion.status is OpinionStatus.PARTIAL, result.second_opinion  # bashlex's own
    assert not result.second_opinion.confirmed and result.second_opinion.shfmt == shfmt_status
    assert decided(policy, TEXT) is Verdict.ASK  # the policy's unconfirmed


def test_missing_shfmt_leaves_the_text_unconfirmed(policy: CompiledPolicy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shfmt, "binary", lambda: None)
    unconfirmed(policy, "failed")
    assert "not installed" in analyze(TEXT, use_cache=False).second_opinion.detail


def test_a_killed_shfmt_leaves_the_text_unconfirmed(
    policy: CompiledPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_shfmt(tmp_path, "kill -9 $$")
    monkeypatch.setattr(shfmt, "binary", lambda: fake)
    unconfirmed(policy, "failed")
    assert "killed by signal 9" in analyze(TEXT, use_cache=False).second_opinion.detail


def test_a_hanging_shfmt_is_cut_by_the_wall_timeout(
    policy: CompiledPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_shfmt(tmp_path, "exec sleep 60")
    monkeypatch.setattr(shfmt, "binary", lambda: fake)
    monkeypatch.setattr(shfmt, "WALL_SECONDS", 0.5)
    unconfirmed(policy, "timeout")


def test_a_spinning_shfmt_is_stopped_by_its_cpu_limit(tmp_path: Path) -> None:
    spin = fake_shfmt(tmp_path, "while :; do :; done")
    reply = shfmt.run("ls", spin, wall_seconds=60)  # the CPU limit (2 s) ends it, not the wall
    assert reply["status"] == "failed" and "signal" in reply["error"]


def test_output_past_the_cap_is_too_large_not_read(
    policy: CompiledPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_shfmt(tmp_path, "exec cat /dev/zero")
    monkeypatch.setattr(shfmt, "binary", lambda: fake)
    unconfirmed(policy, "too_large")


def test_a_text_shfmt_rejects_stays_unconfirmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reply = shfmt.run("echo $((1 +")
    assert reply["status"] == "unparsed" and "must be followed by" in reply["error"]


def test_a_parse_is_kept_by_the_texts_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    first = shfmt.parse(TEXT)
    assert first.status == "ok"
    monkeypatch.setattr(shfmt, "binary", lambda: None)  # not run again
    assert shfmt.parse(TEXT) == first
    assert shfmt.parse(TEXT, use_cache=False).status == "failed"


def test_a_failure_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_shfmt(tmp_path, "kill -9 $$")
    monkeypatch.setattr(shfmt, "binary", lambda: fake)
    assert shfmt.parse(TEXT).status == "failed"
    monkeypatch.undo()
    assert shfmt.parse(TEXT).status == "ok"


def test_shfmt_gets_no_environment_and_runs_in_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGW_PROBE", "leaked")
    spy = fake_shfmt(tmp_path, "cat > /dev/null; echo \"$(pwd) $(env | tr '\\n' ' ')\" >&2; exit 3")
    reply = shfmt.run("ls", spy)
    assert reply["status"] == "failed" and "(exit status 3): / " in reply["error"]
    assert "AGW_PROBE" not in reply["error"] and "GOMAXPROCS=1" in reply["error"]


def test_shfmt_may_not_write_a_file(tmp_path: Path) -> None:
    writer = fake_shfmt(tmp_path, f"cat > /dev/null; echo x > {tmp_path / 'written'}")
    reply = shfmt.run("ls", writer)
    assert reply["status"] == "failed" and "signal 25" in reply["error"]  # SIGXFSZ: RLIMIT_FSIZE 0
    assert not (tmp_path / "written").exists() or (tmp_path / "written").stat().st_size == 0


def test_a_large_here_document_is_confirmed() -> None:
    """Near the analyser's 64 KiB cap: a file written with a quoted here-document."""
    body = "\n".join(f"line {i}: $HOME `x` \\ 'q'" for i in range(2400))
    text = f"cat <<'EOF' > notes.txt\n{body}\nEOF"
    assert 60_000 < len(text.encode()) < shfmt.MAX_SHFMT_BYTES
    result = analyze(text, use_cache=False)
    assert result.denial is None and result.second_opinion.status is OpinionStatus.CONFIRMED_BY_SHFMT


# --- every text the analyser accepts reads the same to mvdan/sh --------------------------------------
# Whether or not bashlex confirms it today: were bashlex to fail on any of these, mvdan/sh must not
# turn an honest text into a denial (205 texts, every construct the table covers).


def test_every_accepted_table_text_reads_the_same_to_mvdan_sh() -> None:
    from tests.analysis.test_commands_table import CASES

    accepted = [t for t, expected in CASES if isinstance(expected, list)]
    differences = {}
    for text in accepted:
        parsed = shfmt.parse(text)
        if parsed.status != "ok":
            differences[text] = f"{parsed.status}: {parsed.error}"
        elif problems := compare_exact(primary.walk(text), parsed.commands):
            differences[text] = problems[0]
    assert len(accepted) >= 150 and differences == {}
