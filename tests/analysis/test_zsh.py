"""gateway/analysis/zsh.py: a zsh line is decided as bash text only where zsh reads it as bash
does; every other line is refused with a reason naming the construct (issue 26, point 5).

Each attack below is a line the bash analysis ALLOWS under the shipped terminal-interface policy
(checked here): a zsh allowed without this check would run it, and zsh would run code through a
glob qualifier, look programs up in another PATH, or call a function on its own later. The rest
are refused by the bash analysis too, and refused here with zsh's reason (so they stay refused
whatever a policy allows). The lists of names are pinned against the real zsh."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gateway.analysis import shfmt, zsh
from gateway.analysis.analyzer import cache as analysis_cache
from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.selftest import load_checked

ALLOWED_AS_BASH = {
    # line: a word of the reason
    "ls *(e:'touch /tmp/pwn':)": "*(e:'touch /tmp/pwn':)",  # (bash: a syntax error, yet ...)
    "echo =ls": "=cmd",
    "path=(/tmp/evil $path)": "path",
    "path+=(/tmp)": "path",
    "set -A path /tmp/evil": "set -A",
    "fpath=(/tmp)": "fpath",
    "module_path=(/tmp)": "module_path",
    "TRAPEXIT() { touch x; }": "TRAPEXIT",
    "TRAPDEBUG() { touch x; }": "TRAPDEBUG",
    "function TRAPZERR { touch x; }": "TRAPZERR",
    "chpwd() { touch x; }": "chpwd",
    "precmd() { touch x; }": "precmd",
    "preexec() { touch x; }": "preexec",
    "periodic() { touch x; }": "periodic",
    "zshexit() { touch x; }": "zshexit",
    "command_not_found_handler() { touch x; }": "command_not_found_handler",
    "zshaddhistory() { touch x; }": "zshaddhistory",
    "chpwd_functions=(f)": "chpwd_functions",
    "set -o kshglob": "kshglob",
    "set -F": "set -F",
    "read path": "path",
    "for path in a b; do echo $path; done": "path",
    "printf -v path x": "path",
    "unset -m 'p*'": "unset -m",
    "(( path = 1 ))": "path",
    "> out.txt": "NULLCMD",
    "< in.txt": "READNULLCMD",
    "echo $x:h": "modifier",
    "ls file<1-5>.txt": "file<1-5>.txt",
    "echo hi >! f": "otherwise than bash",
    "cd old new": "cd",
    "cd +1": "cd",
    "x=~y": "~",
    # red team (redzsh): each ran in a zsh session before
    "timeout 10>/dev/null sh echo": "descriptors 0-9",  # zsh runs `timeout 10 sh echo` (the file echo)
    "echo hi 10>x": "descriptors 0-9",
    "T\\RAPZERR() { touch x; }": "TRAPZERR",  # the name as zsh reads it, quotes removed
    "function ch\\pwd { touch x; }": "chpwd",
    "b\\uiltin() { ls; }": "builtin",
    "shift path": "shift",  # zsh shifts the array path (PATH)
    "shift -p path": "shift",
    "shift $x": "shift",
    "set -x": "nonce",  # the trace prints the loop's end marker, nonce and all
    "set -v": "nonce",
    "set -o xtrace": "nonce",
    "ARGV0=git-push": "ARGV0",  # exported, argv[0] of every program zsh runs
    "echo ${x:-{a,b}}": "braces",  # zsh: two words a b
}
"""Lines the bash analysis allows under the shipped terminal-interface policy."""

REFUSED_ANYWAY = {
    "ls *(+f)": "*(+f)",
    "=ls -l": "=cmd",
    "cat ${(e)x}": "parameter expansion flags",
    "echo $~x": "$~",
    "echo ${~x}": "bash does not read",
    "typeset -T FOO foo": "-T",
    "export -T A a": "-T",
    "setopt extended_glob": "setopt",
    "unsetopt equals": "unsetopt",
    "emulate sh": "emulate",
    "alias ll='ls -la'": "alias",
    "alias -g G='| touch x'": "alias",
    "alias -s txt=cat": "alias",
    "zmodload zsh/system": "zmodload",
    "autoload -U compinit": "autoload",
    "zpty x 'touch y'": "zpty",
    "ztcp example.com 80": "ztcp",
    "sched +1 touch x": "sched",
    "noglob ls *": "noglob",
    "hash -d x=/etc": "hash",
    "hash ls=/tmp/evil": "hash",
    "cat ~x/shadow": "named directory",
    "builtin setopt extglob": "setopt",
    "command alias x=y": "alias",
    "exec -a x setopt y": "setopt",
    "functions[ls]='touch x'": "functions",
    "options[equals]=on": "options",
    "aliases[ls]='touch x'": "aliases",
    "nameddirs[x]=/etc": "nameddirs",
    "commands[ls]=/tmp/evil": "commands",
    "echo ${mapfile[/etc/passwd]}": "zsh's parse",
    "echo $x[1]": "$x[1]",
    "TMPPREFIX=/etc/x cat <<< hi": "TMPPREFIX",
    "STTY=raw ls": "STTY",
    "repeat 3 touch x": "repeat",
    "() { touch x }": "anonymous functions",
    "echo =(ls)": "process substitutions",
    "cmd &|": "bash does not read",
    "builtin() { ls; }": "builtin",
    "eval() { ls; }": "eval",
    "print -v x hi": "print",
    "print -z 'touch x'": "print",
    "trap 'touch x' EXIT": "trap",
    "eval 'TRAPEXIT() { touch x; }'": "eval",
    "echo {~x,y}": "named directory",
    "a=(~x)": "named directory",
    "declare -f": "-f",
    "local -h x": "-h",
    "exec {path}>x": "path",
    "r": "history",
    "fc -e - ls": "history",
    "enable -r repeat": "enable",
    "disable -r if": "disable",
    "unhash -d x": "unhash",
    "pushd /tmp": "pushd",
    "coproc touch x": "coproc",
    "float x=1": "float",
    "source x.zsh": "source",
    "echo $commands[ls]": "commands",
}
"""Lines refused by the bash analysis as well (or not bash at all), refused here with zsh's reason."""

HONEST = [
    "git status",
    "cd /project",
    "ls -la",
    'echo "hello $USER"',
    "export MY_VAR=hello",
    "echo $MY_VAR",
    'for f in *.py; do wc -l "$f"; done',
    'x=$(date +%s); echo "$x"',
    "cat README.md | head -20",
    "grep -rn TODO src || true",
    "[[ -f Makefile ]] && make -n",
    "[[ abc =~ b ]] && echo yes",
    "echo ~ ~/x",
    "PATH=$PATH:$HOME/bin",
    "ls **/*.py",
    "echo {a,b}.txt",
    "if [ -d src ]; then ls src; fi",
    "cat <<'EOF'\nhello\nEOF",
    "echo $ZSH_VERSION",
    'echo "$host:$port"',
    "echo ${x:-default}",
    "f() { ls; }; f",
    "set -e",
    "set -o pipefail",
    "set +x",
    "shift 2",
    'echo ${x:-"{a,b}"} 2>&1',
    "exec 2>&1",
    "cd -",
    "local x=1",
    "declare -a arr=(1 2)",
    "echo a=b x==y",
    "echo '=literal' \\~x",
]
"""Lines zsh reads as bash does: decided as bash text."""


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "src").mkdir()
    return load_checked(Path("policies/profiles/terminal-interface.yaml"), ws)


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    shfmt.cache.clear()
    analysis_cache.clear()


@pytest.mark.parametrize("line", list(ALLOWED_AS_BASH))
def test_an_attack_the_bash_gate_allows_is_refused_for_zsh(line: str, policy: CompiledPolicy) -> None:
    """Without this check a zsh session would run it: the bash analysis allows it."""
    verdict = evaluate(policy, line, "agent").decision.verdict
    if line.startswith("ls *("):  # bash reads no command there; the gate's parse fails closed
        assert verdict is not Verdict.ALLOW
    else:
        assert verdict is Verdict.ALLOW, line
    why = zsh.refusal(line)
    assert why is not None and ALLOWED_AS_BASH[line] in why, (line, why)


@pytest.mark.parametrize("line", list(REFUSED_ANYWAY))
def test_every_other_zsh_construct_is_refused_with_its_reason(line: str) -> None:
    why = zsh.refusal(line)
    assert why is not None and REFUSED_ANYWAY[line] in why, (line, why)


@pytest.mark.parametrize("line", HONEST)
def test_lines_zsh_reads_as_bash_are_left_to_the_bash_analysis(line: str) -> None:
    assert zsh.refusal(line) is None


def test_a_parse_that_fails_or_a_missing_shfmt_refuses(tmp_path: Path) -> None:
    """Fail closed: no shfmt, or one that does not answer, is a refusal."""
    assert zsh.refusal("echo hi", path=str(tmp_path / "no-shfmt")) is not None
    assert zsh.refusal("echo 'unclosed") is not None


def _zsh(script: str) -> set[str]:
    done = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return set(done.stdout.split())


def test_every_special_parameter_of_zsh_is_shared_or_refused() -> None:
    """zsh's own list (zsh/parameter's `$parameters`, and the parameters its modules autoload):
    each is either one bash has with the same effect or a name a line may not use."""
    specials = _zsh(
        "zmodload zsh/parameter; for k v in ${(kv)parameters}; do [[ $v == *special* ]] && print -r -- $k; done"
    )
    autoloaded = {line.split()[0] for line in _zsh_lines("zmodload -ap")}
    unknown = {n for n in specials | autoloaded if n not in zsh.SHARED_SPECIALS and n not in zsh.ZSH_NAMES}
    assert not unknown, f"zsh names not classified in gateway/analysis/zsh.py: {sorted(unknown)}"
    for name in (specials | autoloaded) - zsh.SHARED_SPECIALS:
        if name.isidentifier():
            assert zsh.refusal(f"{name}=x") is not None, name


def _zsh_lines(script: str) -> list[str]:
    done = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_every_builtin_and_reserved_word_of_zsh_is_bashs_or_refused() -> None:
    """A command zsh has that bash has not is refused by name (bash would run a program of that
    name, or nothing): pinned against zsh's `$builtins`, `$reswords` and its autoloaded builtins."""
    builtins = _zsh("zmodload zsh/parameter; print -l ${(k)builtins} ${(k)reswords}")
    builtins |= {line.split()[0] for line in _zsh_lines("zmodload -ab")}
    bash = set(subprocess.run(["bash", "-c", "compgen -b; compgen -k"], capture_output=True, text=True,
                              check=True).stdout.split())  # fmt: skip
    zsh_only = builtins - bash - {"{", "}", "[[", "!"}
    unrefused = sorted(b for b in zsh_only if b not in zsh.REFUSED_COMMANDS)
    assert not unrefused, f"zsh's own commands a zsh line could run: {unrefused}"
