"""The layers (docs/architecture.md) hold: `make lint` runs the import contracts of pyproject.toml,
an upward import breaks them with a message naming the contract, and no import inside a
function is left to hide an import cycle.

The contracts are checked by import-linter on a copy of the package with one import added, the
way a change would add it; the lazy imports are read from the source with `ast`.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gateway"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LAYERS = "The layers, from the faces down to the shared values"
MARKER = "# lazy:"


def lint_copy(tmp_path: Path, added: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of the package and its contracts, with `added` text appended to
    the named files of the copy (a file that is not there is created)."""
    shutil.copytree(PACKAGE, tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for name, text in added.items():
        with (tmp_path / name).open("a") as f:
            f.write(text)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # ahead of the editable install's finder
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def test_make_lint_runs_the_contracts() -> None:
    lint = re.search(r"^lint:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.M | re.S)
    assert lint is not None and "lint-imports" in lint.group(0)


def test_the_contracts_hold_on_the_package_as_it_is(tmp_path: Path) -> None:
    proc = lint_copy(tmp_path, {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("name", "text", "contract", "names"),
    [
        # the sandbox reaching up into the gate
        ("gateway/sandbox/upward.py", "from gateway.pipeline import Gateway\n", LAYERS,
         "gateway.sandbox.upward -> gateway.pipeline"),
        # the audit log reaching up into the policy (audit/replay.py once did)
        ("gateway/audit/upward.py", "from gateway.policy.compile import CompiledPolicy\n", LAYERS,
         "gateway.audit.upward -> gateway.policy.compile"),
        # the gate importing a tool family, inside a function (pipeline.py once did)
        ("gateway/decide.py", "\n\ndef _family() -> None:\n    from gateway.tools import run  # noqa: F401\n",
         "The gate never imports a tool family", "gateway.decide -> gateway.tools.run"),
        # the analyser importing the sandbox (analysis/second_opinion.py once did)
        ("gateway/analysis/upward.py", "from gateway.sandbox import helper\n",
         "The analyser and the sandbox never import each other", "gateway.analysis.upward -> gateway.sandbox.helper"),
        # a face importing the CLI (server/serve.py once did)
        ("gateway/server/upward.py", "from gateway import cli\n", "Nothing imports the CLI",
         "gateway.server.upward -> gateway.cli"),
        # one tool family importing another (run, session and process once did)
        ("gateway/tools/files.py", "\nfrom gateway.tools import session  # noqa: E402\n",
         "Tool families are independent", "gateway.tools.files -> gateway.tools.session"),
        # a module in no layer: every module of the package must have its place
        ("gateway/unplaced.py", '"""Somewhere."""\n', LAYERS, "gateway.unplaced"),
    ],
)  # fmt: skip
def test_an_upward_import_fails_lint_naming_the_contract(
    tmp_path: Path, name: str, text: str, contract: str, names: str
) -> None:
    proc = lint_copy(tmp_path, {name: text})
    assert proc.returncode != 0, proc.stdout
    broken = [line for line in proc.stdout.splitlines() if " BROKEN" in line]
    assert any(line.startswith(contract) for line in broken), proc.stdout
    assert names in proc.stdout, proc.stdout


# --- lazy imports --------------------------------------------------------------------------


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = modules()


def targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package's modules an import statement of `module` loads by name."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    if node.level:
        base = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in MODULES]
    return found or ([source] if source in MODULES else [])


def parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def top_level_graph() -> dict[str, set[str]]:
    """What importing each module runs at once: its imports outside functions (not under
    TYPE_CHECKING), and the packages above each module it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges: set[str] = set()

        def visit(body: list[ast.stmt], module: str = module, edges: set[str] = edges) -> None:
            for stmt in body:
                if isinstance(stmt, ast.Import | ast.ImportFrom):
                    edges.update(targets(module, stmt))
                elif isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                    visit(stmt.orelse)
                elif isinstance(stmt, ast.If | ast.Try | ast.With):
                    for field in ("body", "orelse", "finalbody", "handlers"):
                        for inner in getattr(stmt, field, []):
                            visit(inner.body if isinstance(inner, ast.ExceptHandler) else [inner])

        visit(ast.parse(path.read_text()).body)
        graph[module] = {p for t in edges for p in (*parents(t), t) if p not in parents(module) and p != module}
    return graph


def reaches(graph: dict[str, set[str]], start: set[str], goal: str) -> bool:
    seen, todo = set(start), list(start)
    while todo:
        current = todo.pop()
        if current == goal:
            return True
        for nxt in graph.get(current, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def lazy_imports() -> Iterator[tuple[str, int, list[str], bool]]:
    """(module, line, what it loads, whether it is marked) for every import of the package's
    own modules made inside a function: an import statement, or importlib.import_module /
    __import__ with a literal name. Marked: `# lazy: WHY` at the end of its line, or on the
    line above it (above the first of a run of import statements)."""
    for module, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        import_lines: dict[int, int] = {}  # any line of an import statement -> its first line
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for n in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    import_lines[n] = node.lineno

        def marked(line: int, lines: list[str] = lines, import_lines: dict[int, int] = import_lines) -> bool:
            if MARKER in lines[line - 1]:
                return True
            above = line - 1
            while above in import_lines:  # the run of imports this one belongs to
                above = import_lines[above] - 1
            return above >= 1 and lines[above - 1].strip().startswith(MARKER)

        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            for node in ast.walk(func):
                loads: list[str] = []
                if isinstance(node, ast.Import | ast.ImportFrom):
                    loads = targets(module, node)
                elif (
                    isinstance(node, ast.Call)
                    and ast.unparse(node.func) in ("importlib.import_module", "__import__", "import_module")
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).split(".")[0] == "gateway"
                ):
                    loads = [str(node.args[0].value)]
                if loads:
                    yield module, node.lineno, loads, marked(node.lineno)


def test_every_lazy_import_is_marked_with_its_reason() -> None:
    """An import inside a function is allowed only where a comment says why (`# lazy: ...`:
    start-up speed, an optional extra), never silently."""
    unmarked = sorted({f"{m}:{line} imports {', '.join(t)}" for m, line, t, ok in lazy_imports() if not ok})
    assert not unmarked, "imports inside functions without a `# lazy: WHY` comment:\n" + "\n".join(unmarked)


def test_no_lazy_import_hides_a_cycle() -> None:
    """Each lazy import could move to the top of its module: what it loads does not, at import
    time, come back to the module importing it."""
    graph = top_level_graph()
    hidden = []
    for module, line, loads, _ in lazy_imports():
        for target in loads:
            # the packages above it that are not the module's own (those are being imported already)
            start = {target, *(p for p in parents(target) if p not in (*parents(module), module))}
            if reaches(graph, start, module):
                hidden.append(f"{module}:{line} -> {target}")
    assert not hidden, "lazy imports that hide an import cycle:\n" + "\n".join(sorted(set(hidden)))


def test_the_cycle_check_sees_a_cycle() -> None:
    """The check above is not vacuous: pipeline.py imports decide.py at the top, so decide.py
    importing pipeline.py inside a function would be a hidden cycle."""
    graph = top_level_graph()
    assert reaches(graph, {"gateway.pipeline"}, "gateway.decide")
    assert not reaches(graph, {"gateway.decide"}, "gateway.pipeline")
