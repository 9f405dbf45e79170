"""Wrong decisions on the public honest corpus, and the adversarial suite's numbers (run by hand:
`.venv/bin/python bench/corpus.py`; the numbers go into docs/performance.md, "Precision").

The corpus is bench/data/honest_corpus.jsonl (tests/adversarial/honest_corpus.py says what a
line holds); the adversarial suite is tests/adversarial/test_default_policy.py's ATTACKS and
HONEST lists under the shipped policy.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.decide import evaluate  # noqa: E402
from gateway.decision import Verdict  # noqa: E402
from gateway.policy.selftest import load_checked  # noqa: E402
from tests.adversarial.honest_corpus import POLICIES, load, make_workspace, measure  # noqa: E402
from tests.adversarial.test_default_policy import ATTACKS, HONEST, RUN_CALL_ATTACKS  # noqa: E402


def adversarial(ws: Path) -> None:
    for d in ("src", "tests", "docs", "build", "scripts"):
        (ws / d).mkdir()
    (ws / "src" / "app.py").write_text("print(1)\n")
    (ws / "src" / "util.py").write_text("x = 1\n")
    (ws / "README.md").write_text("hello\n")
    (ws / "package.json").write_text("{}\n")
    (ws / "escape").symlink_to("/etc")
    policy = load_checked(ROOT / "policies" / "default.yaml", ws)
    attacks = Counter(evaluate(policy, c, "agent").decision.verdict.label for c in ATTACKS)
    honest = Counter(evaluate(policy, c, "agent").decision.verdict.label for c in HONEST)
    held = attacks[Verdict.DENY.label]
    print(f"adversarial suite (shipped policy): {held}/{len(ATTACKS)} attacks denied {dict(attacks)};")
    run_calls = Counter(
        evaluate(policy, c, "agent", sandboxed=True, fresh_shell=True).decision.verdict.label for c in RUN_CALL_ATTACKS
    )
    print(f"  as run calls: {run_calls[Verdict.DENY.label]}/{len(RUN_CALL_ATTACKS)} denied {dict(run_calls)};")
    print(f"  {honest['allow']}/{len(HONEST)} of its honest commands allowed {dict(honest)}")


def main() -> None:
    lines = load()
    print(f"honest corpus: {len(lines)} lines from {len({line.source.split('/')[1] for line in lines})} sources")
    with tempfile.TemporaryDirectory(prefix="agw-corpus-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        make_workspace(ws, lines)
        for name in sorted(POLICIES):
            print(measure(name, ws, lines).report(limit=3))
        adv = Path(tmp) / "adv"
        adv.mkdir()
        adversarial(adv)


if __name__ == "__main__":
    main()
