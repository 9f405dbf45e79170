"""Everyday tools under the shipped policy (issue 26, class 12), through the real interface: the
gateway's `run` and `session` tools, the real sandbox, real tar, zip, unzip and man.

Honest uses work (each was refused before: no rule named tar, zip, unzip, base64, comm, man, ps or
arch). The attacks go through each tool's own options: the ones that run a program (tar
--to-command, -I, --use-compress-program, --checkpoint-action, -F, --rmt-command, a remote
archive; zip -TT, --unzip-command, -T), write or read outside (zip -lf, -b, unzip -d), members
that climb out on extraction (`../x`, `/abs`, a symlink then a file through it, tar -P,
unzip -:), and a pager's shell escape (man in a terminal pages through `cat`). Each attack must be
denied, or, where the policy allows the command, leave nothing outside the workspace: the host is
checked afterwards, and each test has a positive control.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.test_sandbox_escapes import Lab, host_dir, text_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hands the workspace to the sandbox's account: run as root")


__all__ = ["host_dir"]  # the fixture, shared with test_sandbox_escapes


@pytest.fixture
def lab(tmp_path: Path, host_dir: Path) -> Iterator[Lab]:
    the_lab = Lab(tmp_path, host_dir, git=False)
    try:
        yield the_lab
    finally:
        the_lab.close()


def ok(out: dict[str, Any], command: str) -> str:
    assert out["status"] == "ok" and out.get("exit_code") == 0, f"{command}: {out}"
    return text_of(out)


def denied(out: dict[str, Any], command: str) -> None:
    assert out["status"] == "denied", f"{command} was not denied: {out}"


def evil_members(lab: Lab) -> list[tuple[str, str, bytes]]:
    """(name, kind, data-or-link-target): members that would land outside the workspace if the
    extracting program followed their names, and one honest member (the positive control)."""
    return [
        ("../outside/dotdot.txt", "file", b"x\n"),  # tmp_path/outside, beside the workspace
        (f"{lab.outside}/absolute.txt", "file", b"x\n"),  # a host directory in /var/tmp
        ("tlink", "link", str(lab.tmp_outside).encode()),
        ("tlink/through.txt", "file", b"x\n"),
        ("vlink", "link", str(lab.outside).encode()),
        ("vlink/through.txt", "file", b"x\n"),
        ("honest.txt", "file", b"honest\n"),
    ]


def evil_tar(lab: Lab, name: str) -> None:
    with tarfile.open(lab.ws / name, "w") as t:
        for member, kind, data in evil_members(lab):
            info = tarfile.TarInfo(member)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, data.decode()
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    lab.hand_over()


def evil_zip(lab: Lab, name: str) -> None:
    with zipfile.ZipFile(lab.ws / name, "w") as z:
        for member, kind, data in evil_members(lab):
            info = zipfile.ZipInfo(member)
            if kind == "link":
                info.create_system = 3
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, data)
    lab.hand_over()


def nothing_outside(lab: Lab) -> None:
    found = [str(p) for d in (lab.outside, lab.tmp_outside) for p in d.rglob("*")]
    assert not found, f"written outside the workspace: {found}"


@pytest.mark.parametrize(
    "command",
    ["tar -xf evil.tar", "tar xf evil.tar", "tar -xvf evil.tar -C sub", "unzip -o evil.zip", "unzip -o evil.zip -d sub",
     "unzip -qo -d sub evil.zip"],
)  # fmt: skip
def test_members_named_to_climb_out_stay_in_the_workspace(lab: Lab, command: str) -> None:
    evil_tar(lab, "evil.tar")
    evil_zip(lab, "evil.zip")
    lab.put("sub/.keep", "")
    out = lab.run(command)
    assert out["status"] == "ok", out  # allowed: the members go under the extraction directory
    where = lab.ws / "sub" if "sub" in command else lab.ws
    assert (where / "honest.txt").read_text() == "honest\n", text_of(out)  # the positive control
    nothing_outside(lab)


EXTRACTION_ATTACKS = [
    "tar -xPf evil.tar",  # absolute and .. names kept
    "tar -xf evil.tar -C {outside}",
    "unzip -:o evil.zip",  # .. kept
    "unzip -o evil.zip -d {outside}",
    "unzip -o evil.zip -d {tmp_outside}",
    'D={outside}; unzip -o evil.zip -d "$D"',
    "UNZIP=-: unzip -o evil.zip",
    "TAR_OPTIONS=-P tar -xf evil.tar",
]


@pytest.mark.parametrize("template", EXTRACTION_ATTACKS)
def test_extraction_out_of_the_workspace_is_denied(lab: Lab, template: str) -> None:
    evil_tar(lab, "evil.tar")
    evil_zip(lab, "evil.zip")
    command = template.format(outside=lab.outside, tmp_outside=lab.tmp_outside)
    denied(lab.run(command), command)
    nothing_outside(lab)


CODE_ATTACKS = [
    "tar -xf ok.tar --to-command='touch mark'",
    "tar -xf ok.tar --to-com='touch mark'",
    "tar -cf a.tar -I 'touch mark' ok.txt",
    "tar --use-compress-program='touch mark' -cf a.tar ok.txt",
    "tar --use-comp='touch mark' -cf a.tar ok.txt",
    "tar -cf a.tar --checkpoint=1 --checkpoint-action=exec='touch mark' ok.txt",
    "tar -cf a.tar --rmt-command='touch mark' ok.txt",
    "tar -cf a.tar --rsh-command='touch mark' host:a.tar ok.txt",
    "tar -cf host:a.tar ok.txt",
    "tar -cML 1 -F 'touch mark' -f a.tar ok.txt",
    "tar -cf a.tar --info-script='touch mark' ok.txt",
    "tar xIf 'touch mark' ok.tar",  # the old style: I takes the first word after the bundle
    "tar cfI a.tar 'touch mark' ok.txt",
    "TAR_OPTIONS=--to-command=touch\\ mark tar -xf ok.tar",
    "zip -T -TT 'touch mark' a.zip ok.txt",
    "zip -qTT 'touch mark' -T a.zip ok.txt",  # -TT inside a cluster
    "zip -T -TT='touch mark' a.zip ok.txt",
    "zip -T --unzip-command='touch mark' a.zip ok.txt",
    "zip -T --unzip-c 'touch mark' a.zip ok.txt",  # a unique prefix
    "zip -T a.zip ok.txt",  # runs unzip through a shell with the archive's name
    "zip -lf {outside}/log a.zip ok.txt",
    "zip -b {outside} a.zip ok.txt",
    "zip -r {outside}/out.zip .",
    "zip a.zip -@ < list.txt",  # names arriving at run time
    "ZIPOPT='-T -TT touch\\ mark' zip a.zip ok.txt",
    "man -P 'touch mark' ls",
    "man --pager='touch mark' ls",
    "man -H ls",
    "man -C evil.conf ls",
    "MANPAGER='touch mark' man ls",
]


@pytest.mark.parametrize("template", CODE_ATTACKS)
def test_options_that_run_programs_or_reach_outside_are_denied(lab: Lab, template: str) -> None:
    lab.put("ok.txt", "ok\n")
    lab.put("list.txt", f"{lab.outside}/secret\n")
    lab.put("evil.conf", "DEFINE pager touch mark\n")
    with tarfile.open(lab.ws / "ok.tar", "w") as t:
        t.add(lab.ws / "ok.txt", "ok.txt")
    lab.hand_over()
    command = template.format(outside=lab.outside)
    denied(lab.run(command), command)
    assert not (lab.ws / "mark").exists(), command
    nothing_outside(lab)


def test_honest_archives_and_everyday_tools_work(lab: Lab) -> None:
    lab.put("src/app.py", "print(1)\n")
    lab.put("src/app.pyc", "junk\n")
    lab.put("a.txt", "x\ny\nz\n")
    lab.put("b.txt", "y\nz\nw\n")
    lab.put("build/.keep", "")
    steps = [
        ("tar -czf out.tgz src", None),
        ("tar -tzf out.tgz", "src/app.py"),
        ("tar xzf out.tgz -C build", None),
        ("tar -C build -cf b.tar src", None),
        ("zip -qr out.zip src -x '*.pyc'", None),
        ("unzip -l out.zip", "src/app.py"),
        ("unzip -qo out.zip -d unz", None),
        ("base64 a.txt | base64 -d", "y"),
        ("comm -12 <(sort a.txt) <(sort b.txt)", "y\nz"),
        ("ps aux", "PID"),
        ("arch", None),
        ('tar -czf "backup-$(date +%F).tgz" src', None),
    ]
    for command, shown in steps:
        out = ok(lab.run(command), command)
        if shown is not None:
            assert shown in out, f"{command}: {out}"
    assert (lab.ws / "build" / "src" / "app.py").read_text() == "print(1)\n"
    assert (lab.ws / "unz" / "src" / "app.py").exists() and not (lab.ws / "unz" / "src" / "app.pyc").exists()
    assert list(lab.ws.glob("backup-*.tgz"))


def test_a_pager_in_a_session_terminal_is_cat(lab: Lab) -> None:
    """man writing to a session's terminal pages its output: through `cat`, never `less`, whose
    `!cmd` would run a command no one decided. The call returns the page (a pager waiting for
    keys would hold it until the timeout), and `!touch mark` typed after it runs nothing."""
    started = lab.session("start", pty=True)
    assert started["status"] == "ok", started
    sid = started["session_id"]
    out = lab.session("exec", session_id=sid, command="man ls", timeout_ms=60_000)
    assert out["status"] == "ok", out
    assert "list directory contents" in text_of(out), out
    lab.session("exec", session_id=sid, command="!touch mark", timeout_ms=20_000)
    assert not (lab.ws / "mark").exists()
    env = lab.session("exec", session_id=sid, command='echo "$PAGER $MANPAGER $LESSSECURE"', timeout_ms=20_000)
    assert "cat cat 1" in text_of(env), env
