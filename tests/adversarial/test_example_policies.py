"""Every example policy does what its header says (issue 26, class 13).

Each header states its claims as `# [tag] text`; the policy's tests file holds cases, each naming
the claim it checks (`"claim": "tag"`), run through the real decision pipeline. Every claim has
cases, every case names a claim of the header, and every case passes: a header that promises
what the rules do not do (read-mostly's "no redirection into a file" while `echo x > README.md`
was allowed; its project runs reading /etc/shadow; ci-runner's test suite, which the default's
build rule it includes refused as writes) fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.decide import test_cases as cases_of_tests_file
from gateway.policy.compile import load_policy
from gateway.policy.loader import PolicyError
from gateway.policy.selftest import load_checked

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "policies" / "examples").glob("*.yaml"))
CLAIM = re.compile(r"^# \[([a-z-]+)\] ", re.MULTILINE)


def header(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[: text.index("\nversion:")]


def workspace(root: Path) -> Path:
    ws = root / "ws"
    for d in ("src", "build", "tests", "scripts"):
        (ws / d).mkdir(parents=True)
    for f in ("README.md", "a.txt", "b.txt", "setup.py", "package.json", "src/app.py", "scripts/check.py"):
        (ws / f).write_text("x\n")
    return ws


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_header_claim_is_tested_and_holds(path: Path, tmp_path: Path) -> None:
    claims = CLAIM.findall(header(path))
    assert claims, f"{path.name}: the header states no `# [tag]` claims"
    policy = load_checked(path, workspace(tmp_path))
    assert policy.tests is not None, f"{path.name} names no tests file"
    lines = [json.loads(line) for line in policy.tests.read_text(encoding="utf-8").splitlines() if line.strip()]
    tested = {line.get("claim") for line in lines}
    assert not tested - set(claims), f"cases name claims the header does not state: {tested - set(claims)}"
    assert not set(claims) - tested, f"claims no case checks: {set(claims) - tested}"
    principal = next(iter(policy.grants))
    failed = [f"{c.name}: {c.detail}" for c in cases_of_tests_file(policy, principal) if not c.passed]
    assert not failed, "\n".join(failed)


def test_no_layer_relaxes_the_ci_runners_network_denial(tmp_path: Path) -> None:
    ci = EXAMPLES[[p.stem for p in EXAMPLES].index("ci-runner")]
    top = tmp_path / "top.yaml"
    top.write_text(
        f'version: 1\ninclude: ["{ci}"]\nrules:\n  - id: network\n    decision: allow\n'
        '    justification: "x"\n    programs: ["curl"]\n    examples: {match: ["curl x"]}\n'
    )
    with pytest.raises(PolicyError, match="final"):
        load_policy(top, workspace(tmp_path))
