"""The awk program analysis: strings, regular expressions and code told apart."""

from __future__ import annotations

import pytest

from gateway.programs import awk

# (program, runs code, writes (None: a target known only at run time), refused)
TABLE = [
    ("{print $1}", False, [], False),
    ("NR>1 {s+=$2} END {print s}", False, [], False),
    ("$3 > 10 {print}", False, [], False),  # a comparison, outside print
    ("/a|b/ {print}", False, [], False),  # | inside a regular expression
    ("{print ($1 > 2)}", False, [], False),  # a comparison inside parentheses
    ("{print $1 || $2}", False, [], False),
    ("BEGIN { x = 4 / 2; y = x / 2; print x, y }", False, [], False),  # divisions, not regexps
    ("/[/]|x/ {print}", False, [], False),  # / inside a bracket expression
    ("/[[:alpha:]]+|[]x]/ {print}", False, [], False),
    ('{print "a|b" > "out.txt"}', False, ["out.txt"], False),
    ('{printf("%s\\n", $1) >> "log.txt"}', False, ["log.txt"], False),
    ('{print $1, \\\n $2 > "f.txt"}', False, ["f.txt"], False),  # a continued line
    ('{print $1,\n $2 > "f.txt"}', False, ["f.txt"], False),  # a newline after a comma continues
    ('{if ($1 > 0) print > "pos.txt"; else print > "neg.txt"}', False, ["pos.txt", "neg.txt"], False),
    ("{print > $2}", False, [None], False),
    ('{print > "a" ".txt"}', False, [None], False),
    ('{print | "sh"}', True, [], False),
    ('{print |& "/inet/tcp/0/h/80"}', True, [], False),
    ('BEGIN {cmd = "sh"; print "id" | cmd}', True, [], False),
    ('BEGIN {system("id")}', False, [], True),
    ('BEGIN {print "system"}', False, [], True),  # refused anywhere, even in a string
    ('BEGIN {"id" | getline x}', False, [], True),
    ('BEGIN {while ((getline l < "/etc/passwd") > 0) print l}', False, [], True),
    ('BEGIN {print ENVIRON["HOME"]}', False, [], True),
    ('BEGIN {ARGV[1] = "/etc/passwd"; ARGC = 2} {print}', False, [], True),
    ('BEGIN {f = "sys" "tem"; @f("id")}', False, [], True),
    ('@load "filefuncs"', False, [], True),
    ('/"/ {print} ; BEGIN { x = "\\" }', False, [], True),  # a string left open
    ('{print "unterminated}', False, [], True),
    ("/unterminated {print}", False, [], True),
    # where a / after `)` starts a regular expression (an if condition) and where it divides
    ("{if (x) /a|b/ ? y = 1 : y = 2}", False, [], False),  # after an if condition: a regexp
    ('{y = (a) / 2; z = b / 3 | "sh"}', True, [], False),  # after an operand's `)`: division
]


@pytest.mark.parametrize(("program", "runs", "writes", "refused"), TABLE, ids=[t[0][:50] for t in TABLE])
def test_table(program: str, runs: bool, writes: list[str | None], refused: bool) -> None:
    facts = awk.analyse(program)
    assert bool(facts.error) is refused, facts
    if refused:
        return
    assert [w.value if w.literal else None for w in facts.writes] == writes
    assert bool(facts.runs) is runs, facts
