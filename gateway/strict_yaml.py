"""Reviewed YAML files (policies, program models) read strictly, with the position of every
value; a shared value below the policy and the program models, which both read their files here.

YAML traps refused here (measured on PyYAML 6.0.3, see ../shared/notes/dependencies.md):
duplicate keys (safe_load keeps the last one silently), `yes`/`no`/`on`/`off` as booleans and
`0755` as octal. Only `true`/`false` are booleans and only plain decimals are integers; anything
else stays a string, which the schema then rejects where a boolean or number is expected.
Every error names the file, line and column (`describe_errors` for a schema's).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class YamlError(Exception):
    """A file that cannot be read as strict YAML. The message says where and what to fix."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 surprises, refusing duplicate keys."""


# Keep only YAML 1.2-like resolvers for bool and int; drop the YAML 1.1 ones.
_StrictLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int")]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|false)$"), list("tf"))
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:0|-?[1-9][0-9]*)$"), list("-0123456789"))


class _FastStrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The same rules, parsed by libyaml where PyYAML has it: the program models
    (gateway/programs/) are long, and read on every start (git.yaml: 160 ms pure Python)."""


_FastStrictLoader.yaml_implicit_resolvers = _StrictLoader.yaml_implicit_resolvers


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            first = seen[key].start_mark
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first at line {first.line + 1}); YAML would keep only the last one",
                key_node.start_mark,
            )
        seen[key] = key_node
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_FastStrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _positions(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], tuple[int, int]]) -> None:
    out[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[(*path, key)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _positions(value_node, (*path, key), out)
            out[(*path, key)] = (value_node.start_mark.line + 1, value_node.start_mark.column + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _positions(item, (*path, i), out)


def _loc_text(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _expected(err: dict[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        return f"expected {ctx['expected']}"
    if err["type"] == "extra_forbidden":
        return "this key is not part of the format (a typo?)"
    if err["type"] == "missing":
        return "this field is required"
    if err["type"].startswith("bool"):
        return "expected true or false (YAML's yes/no/on/off are not booleans here)"
    if err["type"].startswith("int"):
        return "expected a whole number written in decimal"
    return str(err["msg"])


def read_source(path: Path, what: str = "the file") -> bytes:
    """The file's bytes, read once: what is parsed is what is hashed (`Parsed.raw`)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise YamlError(f"{path}: cannot read {what}: {exc.strerror}") from None


def read_yaml(
    path: Path, fast: bool = False, what: str = "the file"
) -> tuple[Any, dict[tuple[Any, ...], tuple[int, int]]]:
    """The document at `path` and the (line, column) of every value in it (`fast`: parsed by
    libyaml, whose error messages are worded differently)."""
    return parse_yaml(path, read_source(path, what), fast, what)


def parse_yaml(
    path: Path, raw: bytes, fast: bool = False, what: str = "the file"
) -> tuple[Any, dict[tuple[Any, ...], tuple[int, int]]]:
    """The document in `raw` (the bytes of `path`, which names it in errors) and the (line,
    column) of every value in it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        bad = raw[exc.start : exc.start + 1]
        raise YamlError(f"{path}:{line}: not UTF-8 text (byte {exc.start}: {bad!r})") from None
    loader = _FastStrictLoader(text) if fast else _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise YamlError(f"{path}: {what} file is empty")
        positions: dict[tuple[Any, ...], tuple[int, int]] = {}
        _positions(node, (), positions)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise YamlError(f"{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise YamlError(f"{path}: {exc}") from None
    finally:
        loader.dispose()
    return data, positions


Positions = dict[tuple[Any, ...], tuple[int, int]]


def describe_errors(path: Path, exc: ValidationError, positions: Positions) -> str:
    """One line per error: file, line, column, field, what was got and what was expected."""
    lines = []
    for err in exc.errors():
        loc = tuple(
            p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "union[", "tagged:")))
        )
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in ("str", "list"))))
        line, col = _nearest(positions, loc)
        got = err.get("input")
        got_text = "" if err["type"] == "missing" or isinstance(got, dict | list) else f"got {got!r}, "
        lines.append(f"{path}:{line}:{col}: {_loc_text(loc)}: {got_text}{_expected(dict(err))}")
    return "\n".join(lines)


def _nearest(positions: dict[tuple[Any, ...], tuple[int, int]], loc: tuple[Any, ...]) -> tuple[int, int]:
    while loc and loc not in positions:
        loc = loc[:-1]
    return positions.get(loc, (1, 1))
