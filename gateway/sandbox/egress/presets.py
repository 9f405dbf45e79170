"""Presets: the hosts this machine's own package managers are set up to use.

`python-packages` reads pip's configuration (its files and PIP_* variables: index-url,
extra-index-url), `npm-packages` npm's (npmrc files and NPM_CONFIG_REGISTRY: the registry and
scoped registries), `debian-packages` apt's sources. A preset resolves, when the policy loads,
to the hosts those name, and to the settings a sandboxed pip or npm needs to use the same index
(index URLs and the CA bundle), so a private mirror works without naming its host in the policy.

Only http(s) locations become hosts; `file:` indexes and find-links are host paths no sandbox
sees. Credentials in a URL (`https://user:token@host/`) are never passed into the sandbox: such
an index is listed as a host and left out of the sandbox's settings (the secrets of the policy
are the way to broker a credential).
"""

from __future__ import annotations

import configparser
import glob
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

PRESETS = ("python-packages", "npm-packages", "debian-packages")
PYPI = "https://pypi.org/simple"
PYPI_FILES = "files.pythonhosted.org"
NPM_REGISTRY = "https://registry.npmjs.org/"
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt",)
"""CA bundles the sandbox shows (/etc/ssl/certs is in its curated /etc)."""


class PresetError(ValueError):
    pass


@dataclass(frozen=True)
class Resolved:
    hosts: tuple[str, ...]
    """Host patterns (`host` or `host:port`)."""
    env: tuple[tuple[str, str], ...]
    sources: tuple[str, ...]
    """Where they were read (files and variables), for `gateway check` and docs."""


def resolve(name: str, environ: Mapping[str, str] | None = None, home: Path | None = None) -> Resolved:
    environ = os.environ if environ is None else environ
    home = Path(environ.get("HOME", str(Path.home()))) if home is None else home
    if name == "python-packages":
        return _pip(environ, home)
    if name == "npm-packages":
        return _npm(environ, home)
    if name == "debian-packages":
        return _apt()
    raise PresetError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")


def _host_of(url: str) -> tuple[str | None, bool]:
    """The `host[:port]` pattern of an http(s) URL (None for other schemes), and whether the
    URL carries credentials."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None, False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, False
    try:
        port = parts.port
    except ValueError:
        return None, False
    default = 443 if parts.scheme == "https" else 80
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return (host if port in (None, default) and default in (443, 80) else f"{host}:{port}"), bool(
        parts.username or parts.password
    )


def _pip(environ: Mapping[str, str], home: Path) -> Resolved:
    files = ["/etc/pip.conf"]
    xdg = environ.get("XDG_CONFIG_DIRS", "/etc/xdg")
    files += [f"{d}/pip/pip.conf" for d in xdg.split(":") if d]
    files += [
        str(home / ".pip" / "pip.conf"),
        str(Path(environ.get("XDG_CONFIG_HOME", home / ".config")) / "pip" / "pip.conf"),
    ]
    if environ.get("PIP_CONFIG_FILE"):
        files.append(environ["PIP_CONFIG_FILE"])
    values: dict[str, str] = {}
    read: list[str] = []
    for f in files:
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(f):
                continue
        except configparser.Error as exc:
            raise PresetError(f"python-packages: pip's configuration {f} cannot be read: {exc}") from None
        read.append(f)
        for section in ("global", "download", "install"):
            if parser.has_section(section):
                for key in ("index-url", "extra-index-url", "cert"):
                    if parser.has_option(section, key):
                        values[key] = parser.get(section, key)
    for key in ("index-url", "extra-index-url", "cert"):
        var = "PIP_" + key.upper().replace("-", "_")
        if environ.get(var):
            values[key] = environ[var]
            read.append(f"${var}")
    index = values.get("index-url", PYPI).split()
    extra = values.get("extra-index-url", "").split()
    hosts: list[str] = []
    passed: dict[str, list[str]] = {"PIP_INDEX_URL": [], "PIP_EXTRA_INDEX_URL": []}
    for var, urls in (("PIP_INDEX_URL", index[:1]), ("PIP_EXTRA_INDEX_URL", extra)):
        for url in urls:
            host, secret = _host_of(url)
            if host is None:
                continue
            hosts.append(host)
            if not secret:
                passed[var].append(url)
    if any(h == "pypi.org" for h in hosts):
        hosts.append(PYPI_FILES)  # PyPI serves its files from another host
    env: list[tuple[str, str]] = [(k, " ".join(v)) for k, v in passed.items() if v]
    cert = values.get("cert")
    bundle = cert if cert in CA_BUNDLES else next((b for b in CA_BUNDLES if os.path.exists(b)), None)
    if bundle:
        env.append(("PIP_CERT", bundle))
    return Resolved(tuple(dict.fromkeys(hosts)), tuple(env), tuple(read) or ("pip's defaults",))


def _npmrc(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        out[key.lower()] = value.strip("\"'")
    return out


def _npm(environ: Mapping[str, str], home: Path) -> Resolved:
    files = ["/etc/npmrc", "/usr/etc/npmrc", "/usr/local/etc/npmrc", str(home / ".npmrc")]
    if environ.get("NPM_CONFIG_GLOBALCONFIG"):
        files.insert(0, environ["NPM_CONFIG_GLOBALCONFIG"])
    if environ.get("NPM_CONFIG_USERCONFIG"):
        files.append(environ["NPM_CONFIG_USERCONFIG"])
    values: dict[str, str] = {}
    read: list[str] = []
    for f in files:
        found = _npmrc(f)
        if found:
            read.append(f)
            values.update(found)
    if environ.get("NPM_CONFIG_REGISTRY"):
        values["registry"] = environ["NPM_CONFIG_REGISTRY"]
        read.append("$NPM_CONFIG_REGISTRY")
    registries = {"registry": values.get("registry", NPM_REGISTRY)}
    registries.update({k: v for k, v in values.items() if k.startswith("@") and k.endswith(":registry")})
    hosts: list[str] = []
    env: list[tuple[str, str]] = []
    for key, url in registries.items():
        host, secret = _host_of(url)
        if host is None:
            continue
        hosts.append(host)
        if not secret:
            env.append((f"NPM_CONFIG_{key.upper()}" if key == "registry" else f"NPM_CONFIG_{key}", url))
    if any(b for b in CA_BUNDLES if os.path.exists(b)):
        env.append(("NODE_EXTRA_CA_CERTS", next(b for b in CA_BUNDLES if os.path.exists(b))))
    return Resolved(tuple(dict.fromkeys(hosts)), tuple(env), tuple(read) or ("npm's defaults",))


def _apt() -> Resolved:
    hosts: list[str] = []
    read: list[str] = []
    for f in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        try:
            lines = Path(f).read_text(errors="replace").splitlines()
        except OSError:
            continue
        read.append(f)
        for line in lines:
            words = line.split("#", 1)[0].split()
            if words and words[0] in ("deb", "deb-src"):
                urls = [w for w in words[1:] if "://" in w]
                hosts += [h for h in (_host_of(u)[0] for u in urls[:1]) if h]
    for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        try:
            lines = Path(f).read_text(errors="replace").splitlines()
        except OSError:
            continue
        read.append(f)
        for line in lines:
            if line.lower().startswith("uris:"):
                try:
                    urls = shlex.split(line.split(":", 1)[1])
                except ValueError:
                    continue
                hosts += [h for h in (_host_of(u)[0] for u in urls) if h]
    return Resolved(tuple(dict.fromkeys(hosts)), (), tuple(read) or ("no apt sources",))
