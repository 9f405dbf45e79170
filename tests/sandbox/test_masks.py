"""The deny_read / deny_write patterns and their matches under the roots (gateway/sandbox/masks.py):
what a pattern denies, and a search that stays right as the tree changes under it (it keeps what
it searched and looks again only where inotify says a directory changed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gateway.sandbox import masks
from gateway.sandbox.masks import Patterns

WS = Path("/srv/ws")
SHIPPED = [".env", ".env.*", "!.env.example", "*.pem", "id_rsa*", ".ssh", "config/secret/**", "deploy/*.key"]

# (path, the pattern that denies it, or None)
TABLE = [
    # --- names: any component, at any depth --------------------------------------------------
    ("/srv/ws/.env", ".env"),
    ("/srv/ws/app/.env", ".env"),
    ("/srv/ws/app/.env.local", ".env.*"),
    ("/srv/ws/.env.example", None),  # an exception
    ("/srv/ws/app/.env.example", None),
    ("/srv/ws/k/server.pem", "*.pem"),
    ("/srv/ws/.ssh/config", ".ssh"),  # below a denied directory
    ("/srv/ws/id_rsa.pub", "id_rsa*"),
    ("/srv/ws/src/identity.py", None),
    ("/srv/ws/environment", None),
    ("/srv/ws/x.pem.txt", None),
    # --- paths: anchored at the workspace, `**` any depth -------------------------------------
    ("/srv/ws/config/secret", "/srv/ws/config/secret/**"),
    ("/srv/ws/config/secret/a/b.yaml", "/srv/ws/config/secret/**"),
    ("/srv/ws/config/secrets", None),
    ("/srv/ws/app/config/secret/x", None),  # anchored: not at any depth
    ("/srv/ws/deploy/prod.key", "/srv/ws/deploy/*.key"),
    ("/srv/ws/deploy/sub/prod.key", None),  # `*` is one component
]


@pytest.mark.parametrize(("path", "expected"), TABLE, ids=[p for p, _ in TABLE])
def test_what_a_pattern_denies(path: str, expected: str | None) -> None:
    patterns = Patterns.compile(SHIPPED, WS)
    assert patterns is not None and patterns.match(path) == expected


@pytest.mark.parametrize(
    ("entry", "why"), [("", "empty"), ("../x", "'..'"), ("a/./b", "'.'"), ("**", "every path"), ("!", "empty")]
)
def test_a_bad_pattern_is_refused_naming_it(entry: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Patterns.compile([entry], WS)


def found(root: Path, patterns: list[str]) -> list[str]:
    compiled = Patterns.compile(patterns, root)
    return [os.path.relpath(h.path, root) for h in masks.find([str(root)], compiled)]


def test_the_search_follows_the_tree_as_it_changes(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / ".env").write_text("x")
    pats = [".env", "*.key", ".ssh"]
    assert found(root, pats) == ["a/b/.env"]
    # a new secret deep in a new directory, a renamed directory, a replaced one, a removed secret
    (root / "n" / "m").mkdir(parents=True)
    (root / "n" / "m" / "x.key").write_text("x")
    assert found(root, pats) == ["a/b/.env", "n/m/x.key"]
    os.rename(root / "a", root / "z")
    assert found(root, pats) == ["n/m/x.key", "z/b/.env"]
    shutil.rmtree(root / "n")
    (root / "n" / ".ssh").mkdir(parents=True)
    assert found(root, pats) == ["n/.ssh", "z/b/.env"]
    (root / "z" / "b" / ".env").unlink()
    assert found(root, pats) == ["n/.ssh"]
    # a moved-in tree is searched whole
    outside = tmp_path / "incoming"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "id.key").write_text("x")
    os.rename(outside, root / "z" / "incoming")
    assert found(root, pats) == ["n/.ssh", "z/incoming/deep/id.key"]


def test_links_lead_to_what_they_name(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "config").mkdir(parents=True)
    (root / "config" / "prod.cfg").write_text("x")
    (root / ".env").symlink_to("config/prod.cfg")  # a denied name for a file of another
    (root / "plain.txt").write_text("x")
    os.link(root / "plain.txt", root / "id.key")  # a denied name for a file with another
    assert found(root, [".env", "*.key"]) == ["config/prod.cfg", "id.key", "plain.txt"]


def test_a_root_too_large_to_search_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    for n in range(20):
        (root / f"f{n}").write_text("")
    with pytest.raises(masks.TooManyToSearch):
        masks.find([str(root)], Patterns.compile([".env"], root), limit=10)
