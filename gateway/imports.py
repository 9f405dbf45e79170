"""What an interpreter will load, read from a script's text: Python's imports and Node's
requires (gateway/runfiles.py binds the files they find in the roots to an approval).

Both are read, never run. Python's text is parsed with `ast` (every `import` and `from ...
import`, wherever it stands: inside a function, a `try`, an `if`); Node's with patterns for
`require('...')`, `import ... from '...'`, `import '...'`, `export ... from '...'` and
`import('...')` (over-reading, never under: a specifier in a comment or a string is looked up
too). What a text loads by a name known only at run time (`importlib.import_module(name)`,
`__import__`, `exec`, `runpy`, a `sys.path` it changes, `require(name)`) cannot be told: it is
reported as a notice the supervisor reads, and not bound.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

MAX_NAMES = 256
"""Modules one text is looked for at most; past that, the rest is a notice."""


@dataclass(frozen=True)
class Wanted:
    """A module an interpreter looks for in a directory."""

    directory: str
    """Where it looks (absolute): Python's `sys.path[0]` or a package's directory; the
    directory of the requiring file for Node."""
    name: str
    """Python: one component of a module name (`helper`); Node: a relative specifier (`./lib`)."""
    rest: tuple[str, ...] = ()
    """Python: the components below it (`import a.b.c`: `b`, `c`), looked for inside it when
    it is a package of the roots."""
    leaves: tuple[str, ...] = ()
    """Python: what `from M import x, y` names, looked for as modules of M when M is a package."""
    line: int = 0


_DYNAMIC_CALLS = frozenset({
    "import_module", "__import__", "exec", "eval", "compile", "run_path", "run_module", "spec_from_file_location",
    "load_source", "load_module", "find_spec", "execfile",
})  # fmt: skip
_SYS_PATH_CHANGES = frozenset({"insert", "append", "extend", "__setitem__", "__iadd__"})


def python_imports(text: str, top: str, package: str | None) -> tuple[list[Wanted], list[str]]:
    """The modules `text` imports, each to be looked for: an absolute import in `top` (the
    script's `sys.path[0]`: the directory of the script python was given, the cwd for `-m`),
    a relative one in `package` (the directory of the package the text's module belongs to).
    And notices: what it loads that cannot be told from its text."""
    notices: list[str] = []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return [], [f"python cannot parse it ({type(exc).__name__}), so what it imports is not told"]
    wanted: list[Wanted] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                first, *rest = alias.name.split(".")
                wanted.append(Wanted(top, first, tuple(rest), (), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names if a.name != "*")
            if node.level == 0:
                if node.module in (None, "__future__"):
                    continue
                first, *rest = (node.module or "").split(".")
                wanted.append(Wanted(top, first, tuple(rest), names, node.lineno))
                continue
            if package is None:
                continue  # a relative import outside a package fails at run time: nothing loads
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit("/", 1)[0] or "/"
            if node.module:
                first, *rest = node.module.split(".")
                wanted.append(Wanted(base, first, tuple(rest), names, node.lineno))
            else:
                wanted.extend(Wanted(base, n, (), (), node.lineno) for n in names)
        elif isinstance(node, ast.Call):
            called = _called(node.func)
            if called in _DYNAMIC_CALLS:
                notices.append(f"line {node.lineno}: {called}() loads code by a name or text known only at run time")
            elif called in _SYS_PATH_CHANGES and _on_sys_path(node.func):
                notices.append(f"line {node.lineno}: it changes sys.path, so where it imports from is not told")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value)) for t in targets):
                notices.append(f"line {node.lineno}: it changes sys.path, so where it imports from is not told")
    if len(wanted) > MAX_NAMES:
        notices.append(f"it imports more than {MAX_NAMES} modules: the rest are not looked for")
        wanted = wanted[:MAX_NAMES]
    return wanted, notices


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_sys_path(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _on_sys_path(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and _is_sys_path(func.value)


# --- Node --------------------------------------------------------------------------------------

_SPECIFIER = r"""(['"`])((?:(?!\1)[^\\\n])*)\1"""
_NODE_STATIC = [
    re.compile(r"\brequire\s*\(\s*" + _SPECIFIER + r"\s*\)"),
    re.compile(r"\bimport\s*\(\s*" + _SPECIFIER + r"\s*[,)]"),
    re.compile(r"\bimport\s+" + _SPECIFIER),
    re.compile(r"\bfrom\s+" + _SPECIFIER),
    re.compile(r"\brequire\.resolve\s*\(\s*" + _SPECIFIER),
]
_NODE_DYNAMIC = re.compile(r"\b(?:require|import)\s*\(\s*(?=[^\s'\"`)])")
BUILTINS = frozenset({
    "assert", "async_hooks", "buffer", "child_process", "cluster", "console", "constants", "crypto", "dgram",
    "diagnostics_channel", "dns", "domain", "events", "fs", "http", "http2", "https", "inspector", "module", "net",
    "os", "path", "perf_hooks", "process", "punycode", "querystring", "readline", "repl", "stream", "string_decoder",
    "sys", "timers", "tls", "trace_events", "tty", "url", "util", "v8", "vm", "wasi", "worker_threads", "zlib", "test",
})  # fmt: skip
"""Node's own modules: a bare name among them is never looked up in node_modules."""


def node_requires(text: str, directory: str) -> tuple[list[Wanted], list[str], list[str]]:
    """The relative specifiers `text` loads (each to be looked for from `directory`), the bare
    package names it loads (found in a node_modules: not bound), and notices."""
    relative: list[Wanted] = []
    packages: list[str] = []
    notices: list[str] = []
    for pattern in _NODE_STATIC:
        for m in pattern.finditer(text):
            spec = m.group(2)
            line = text.count("\n", 0, m.start()) + 1
            if m.group(1) == "`" and "${" in spec:
                notices.append(f"line {line}: it loads a module named by a template, known only at run time")
            elif spec.startswith(("./", "../", "/")) or spec in (".", ".."):
                relative.append(Wanted(directory, spec, line=line))
            elif spec and not spec.startswith("node:") and spec.split("/")[0] not in BUILTINS:
                packages.append(spec)
    for m in _NODE_DYNAMIC.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        notices.append(f"line {line}: it loads a module named by an expression, known only at run time")
    if len(relative) > MAX_NAMES:
        notices.append(f"it loads more than {MAX_NAMES} files: the rest are not looked for")
        relative = relative[:MAX_NAMES]
    return relative, sorted(set(packages)), notices
