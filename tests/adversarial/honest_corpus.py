"""The public honest corpus (bench/data/honest_corpus.jsonl): loading it, the workspace its lines
name, and its wrong-decision rates under the shipped policy and the strict read-mostly example.

Each line is {"command", "source", "expect": {"default": ..., "strict": ...}, "note"?}: a shell
line quoted from a public README, CONTRIBUTING file, docs page, CI workflow or agent transcript
(`source` names the repository and path, or the page), and the decision a careful admin means
by each policy's prose (its header), not what the gate says. "unclear" marks a line whose right
decision the prose does not settle (`note` says why); those lines are left out of the rates.

Shared by tests/adversarial/test_honest_corpus.py (the ratchet) and bench/corpus.py (the numbers
in docs/performance.md, "Precision").
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gateway.decide import evaluate
from gateway.decision import Verdict
from gateway.policy.selftest import load_checked

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "bench" / "data" / "honest_corpus.jsonl"
POLICIES = {
    "default": ROOT / "policies" / "default.yaml",
    "strict": ROOT / "policies" / "examples" / "read-mostly.yaml",
}
LABELS = ("allow", "ask", "deny", "unclear")
PRINCIPAL = "agent"

# Files every project has, whether or not a line names them.
BASE_FILES = [
    "README.md", "CONTRIBUTING.md", "LICENSE", "Makefile", "package.json", "pyproject.toml",
    "setup.py", "Cargo.toml", "go.mod", "src/main.py", "src/lib.rs", "tests/test_main.py",
    "docs/index.md", ".gitignore", ".git/HEAD", ".git/config", ".git/hooks/.keep",
]  # fmt: skip
# A word that names a file or directory in the project: relative, no variables, globs or options.
PATH_WORD = re.compile(r"(\./)?[\w@+][\w.@+-]*(/[\w.@+-]+)*/?")
HAS_EXTENSION = re.compile(r"\.[A-Za-z][\w-]{0,9}$")


@dataclass(frozen=True)
class Line:
    command: str
    source: str
    expect: dict[str, str]
    note: str = ""


def load(path: Path = CORPUS) -> list[Line]:
    lines: list[Line] = []
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        spec = json.loads(text)
        expect = spec["expect"]
        for policy in POLICIES:
            if expect.get(policy) not in LABELS:
                raise ValueError(f"{path}:{n}: expect.{policy}: got {expect.get(policy)!r}, expected one of {LABELS}")
        lines.append(Line(spec["command"], spec["source"], expect, spec.get("note", "")))
    return lines


def named_paths(command: str) -> set[str]:
    """The words of `command` that look like project paths (`src/app.py`, `docs/`, `setup.py`)."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        words = command.split()
    found: set[str] = set()
    for word in words:
        if word.startswith(("-", "/", "~", "..")) or not PATH_WORD.fullmatch(word):
            continue
        if "/" in word.rstrip("/") or word.endswith("/") or HAS_EXTENSION.search(word):
            found.add(word.removeprefix("./"))
    return found


def make_workspace(ws: Path, lines: list[Line]) -> None:
    """A project tree holding every file and directory the corpus names, so paths resolve and
    globs match as they would in a real checkout."""
    wanted = set(BASE_FILES)
    for line in lines:
        wanted |= named_paths(line.command)
    dirs = {p.rstrip("/") for p in wanted if p.endswith("/")}
    for p in wanted:
        parts = p.rstrip("/").split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    dirs.discard("")
    for d in sorted(dirs):
        target = ws / d
        if not target.exists():
            target.mkdir(parents=True)
    for p in sorted(wanted - {d + "/" for d in dirs}):
        target = ws / p
        if p not in dirs and not target.exists():
            target.write_text("x\n", encoding="utf-8")


@dataclass
class Outcome:
    policy: str
    counted: int = 0
    unclear: int = 0
    wrong: list[tuple[Line, str, str]] = field(default_factory=list)  # (line, got, reason codes)
    by_expect: Counter[str] = field(default_factory=Counter)
    wrong_by_expect: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return len(self.wrong) / self.counted if self.counted else 0.0

    def by_reason(self) -> dict[str, list[tuple[Line, str, str]]]:
        groups: dict[str, list[tuple[Line, str, str]]] = defaultdict(list)
        for miss in self.wrong:
            groups[f"expected {miss[0].expect[self.policy]}, got {miss[1]}: {miss[2]}"].append(miss)
        return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))

    def report(self, limit: int = 4) -> str:
        out = [
            f"{self.policy}: {len(self.wrong)} wrong of {self.counted} ({100 * self.rate:.1f}%),"
            f" {self.unclear} unclear left out"
        ]
        for expected, n in sorted(self.by_expect.items()):
            out.append(f"  expected {expected}: {self.wrong_by_expect[expected]} wrong of {n}")
        for group, misses in self.by_reason().items():
            out.append(f"  [{len(misses)}] {group}")
            out.extend(f"      {m[0].command[:110]!r}" for m in misses[:limit])
        return "\n".join(out)


def reason_codes(reasons: list[tuple[str, str]]) -> str:
    codes = sorted({f"{stage}/{code}" for stage, code in reasons if code != "allowed"})
    return ", ".join(codes) or "-"


def measure(policy_name: str, workspace: Path, lines: list[Line]) -> Outcome:
    policy = load_checked(POLICIES[policy_name], workspace)
    outcome = Outcome(policy_name)
    for line in lines:
        expected = line.expect[policy_name]
        if expected == "unclear":
            outcome.unclear += 1
            continue
        # as a `run` call decides it: in the gateway's sandbox, a new bash with the environment
        # the gateway builds (a CI variable the text never sets is empty there)
        decision = evaluate(policy, line.command, PRINCIPAL, sandboxed=True, fresh_shell=True).decision
        outcome.counted += 1
        outcome.by_expect[expected] += 1
        if decision.verdict is not Verdict.parse(expected):
            codes = reason_codes([(r.stage, r.code) for r in decision.reasons])
            outcome.wrong.append((line, decision.verdict.label, codes))
            outcome.wrong_by_expect[expected] += 1
    return outcome
