"""The strict example policy (policies/examples/read-mostly.yaml) under attack: a reviewer that
may read and search the workspace and record work with git, nothing else. Every attack must be
denied (not merely asked about): each reads a file outside the workspace, runs code the policy
did not decide, or writes where the policy says the agent writes nothing. Found by red team 13;
every one was allowed before its fix.
"""

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
    (ws / "README.md").write_text("hello\n")
    (ws / "prog.awk").write_text('BEGIN { system("id") }\n')
    (ws / "escape").symlink_to("/etc")
    return load_checked(Path("policies/examples/read-mostly.yaml"), ws)


ATTACKS = [
    # a value attached to an option, where the rule takes every word for a path
    "git blame --contents=/etc/passwd README.md",  # the rule lists no path options
    "git blame --cont=/etc/passwd README.md",
    "git blame --ignore-revs-file=/etc/passwd README.md",
    "git blame -S/etc/passwd README.md",
    "git blame -Sescape/passwd README.md",
    "diff --from-fi=/etc/passwd README.md",
    "du --files0-from=/etc/passwd",
    "file -m/etc/passwd README.md",
    "file --magic-file=/etc/passwd README.md",
    "wc --files0-from=/etc/passwd",
    "head --files0-from=/etc/passwd",
    "sort --files0-from=/etc/passwd",
    "sort -R --random-s=/etc/passwd README.md",
    # awk, read on its words with a pattern over them; now through its model (awk.yaml)
    "awk 'BEGIN{ARGV[1]=\"/etc/passwd\"} {print}' README.md",  # reads /etc/passwd (mawk too)
    "awk 'BEGIN{ARGV[ARGC++]=\"/etc/passwd\"} {print}' README.md",
    "awk -W exec prog.awk",  # mawk: the program comes from a file, whose system() nobody checked
    "awk -E prog.awk",  # gawk's -f that ends the options
    "awk --source='BEGIN{system(\"id\")}'",  # gawk: the program in an option's value
    "awk -e '{print > \"out.txt\"}' README.md",
    "awk -l ./ext",  # gawk loads a shared library
    "awk -d 1 README.md",  # gawk writes awkvars.out
    "awk --profile 1 README.md",  # gawk writes awkprof.out
    # git add/commit, read on their words; now through git's model
    "git commit -S -m x",  # gpg.program runs
    "git commit --gpg-sign=KEY -m x",
    "git commit --frobnicate -m x",  # an option nobody knows
    # a run-time value the shell splits into more words, options among them
    "V='1 --output=/tmp/x'; git log -n $V",
    'git log -n {"$N",--output=/tmp/x}',
    'grep -e {"$V",--file=/etc/passwd} README.md',
    "m=$(cat msg); git commit -m $m",  # msg holding 'x -S' runs gpg
    # a run-time word where a rule without a model forbids options
    'V=-f/etc/passwd; date "$V"',
    "date $(cat args)",
]


@pytest.mark.parametrize("command", ATTACKS)
def test_attack_is_denied(policy: CompiledPolicy, command: str) -> None:
    decision = evaluate(policy, command, "agent").decision
    assert decision.verdict is Verdict.DENY, decision
