"""The permissions stage: which rule decides each command the analyser reported.

For a command, the candidate rules are those naming its program (an index, not a scan). A
candidate applies if casbin says the principal may use it, and matches if every check passes:
subcommand, `when_options`, and for allow/ask rules also forbidden options, argument patterns,
unknown values and env assignments. The strictest matching rule decides (deny > ask > allow). No
match is a denial that names the near misses, so the agent learns what to change.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from functools import lru_cache

from gateway.analysis import Command, Expansion, Flag, RedirectMode, Word
from gateway.analysis.words import numeric_only
from gateway.decision import Decision, Reason, Verdict
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Rule, RuleDecision, Tool
from gateway.programs import Reading, model_for, models_subcommand, producers, reading_of
from gateway.programs.argv import could_be_option, may_split
from gateway.regex import MAX_BACKTRACKING_INPUT, PolicyPattern

STAGE = "permissions"
_JAIL_EXPANDS = frozenset({Expansion.GLOB, Expansion.TILDE})


@dataclass(frozen=True, slots=True)
class Match:
    rule: Rule
    positional: tuple[int, ...]  # argv indices of positional arguments after the subcommand
    reading: Reading | None = None  # the command read through its program's model, when the rule uses it


def decide_command(policy: CompiledPolicy, principal: str, cmd: Command) -> tuple[Decision, list[Match]]:
    """The decision for one command, and the rules that matched it (for the path jail)."""
    if not cmd.argv:
        if not any(r.mode in (RedirectMode.WRITE, RedirectMode.APPEND) for r in cmd.redirects):
            return Decision(Verdict.ALLOW, None, ()), []
        # `> f` truncates f with no program: decided as `: > f`, so a rule that lets `:` write no
        # file (writes: false) refuses it too
        cmd = replace(cmd, argv=(Word(":", (), ":"),))
    program = cmd.program
    misses: list[str] = []
    matches: list[Match] = []
    for rule in policy.by_program.get(program, ()):
        if not policy.may_use(principal, rule):
            misses.append(f"rule {rule.id} needs level {rule.min_level}")
            continue
        found, why = match(rule, cmd)
        if found is not None:
            matches.append(found)
        elif why:
            misses.append(f"rule {rule.id}: {why}")
    shown = " ".join(w.value for w in cmd.argv)[:120]
    if not matches:
        message = f"no rule allows `{shown}`"
        if misses:
            message += " (" + "; ".join(misses[:4]) + ")"
        else:
            message += ": " + _no_rule_for(policy, principal, program)
        return Decision(Verdict.DENY, None, (Reason(STAGE, "no_rule", message, None, {"program": program}),)), []
    verdict = max(Verdict.parse(m.rule.decision.value) for m in matches)
    deciders = [m.rule for m in matches if Verdict.parse(m.rule.decision.value) == verdict]
    code = {Verdict.ALLOW: "allowed", Verdict.ASK: "ask", Verdict.DENY: "denied"}[verdict]
    if verdict is Verdict.ALLOW:
        reasons: tuple[Reason, ...] = (Reason(STAGE, code, f"`{shown}` allowed by {deciders[0].id}", deciders[0].id),)
    else:  # every rule that asks (or denies) is named: who may answer an ask depends on all of them
        reasons = tuple(Reason(STAGE, code, f"`{shown}`: {r.justification}", r.id) for r in deciders)
    return Decision(verdict, deciders[0].id, reasons), matches


_FILE_PROGRAMS = frozenset(
    [
        "cat",
        "head",
        "tail",
        "less",
        "more",
        "tee",
        "touch",
        "cp",
        "mv",
        "mkdir",
        "rm",
        "rmdir",
        "ls",
        "find",
        "grep",
        "stat",
        "file",
        "wc",
        "dd",
        "install",
        "ln",
        "truncate",
    ]
)


def _no_rule_for(policy: CompiledPolicy, principal: str, program: str) -> str:
    """What to do when no rule of the policy names `program` (for this principal): the nearest
    program names it may run, and the files tool where it does the job without a program."""
    usable = sorted(p for p, rules in policy.by_program.items() if any(policy.may_use(principal, r) for r in rules))
    if program in usable:  # rules for it, none for this use (another subcommand)
        subcommands = sorted(
            {
                c
                for r in policy.by_program[program]
                if policy.may_use(principal, r) and r.decision is not RuleDecision.DENY
                for c in r.subcommands or ()
            }
        )
        hint = f"no rule covers this use of {program}"
        if subcommands:
            hint += f" (its rules cover the subcommands {', '.join(subcommands)[:300]})"
        return hint
    hint = f"the policy names no rule for {program}"
    near = difflib.get_close_matches(program, usable, n=3, cutoff=0.8)
    if near:
        hint += f"; did you mean {' or '.join(near)}?"
    if program in _FILE_PROGRAMS and policy.tool_decision(principal, Tool.FILES).value != "deny":
        hint += "; the files tool reads, writes, lists and searches files without running a program"
    return hint


def match(rule: Rule, cmd: Command) -> tuple[Match | None, str]:
    """Does `rule` match `cmd`? The match, or None and why not ("" when the rule does not
    even concern this command, e.g. another subcommand)."""
    argv = cmd.argv
    if not argv or argv[0].value not in rule.programs:
        return None, ""
    i = 1
    if rule.subcommands is not None:
        if len(argv) < 2 or not argv[1].literal or argv[1].value not in rule.subcommands:
            return None, ""
        i = 2
    options, positional = _split(cmd, i, rule.options_end)
    # allow and ask rules read the command through its program's model; deny rules match on
    # the words as before, so a model can never make a deny rule miss
    uses_model = rule.uses_model and (rule.subcommands is None or models_subcommand(cmd))
    reading = reading_of(cmd) if uses_model and rule.decision is not RuleDecision.DENY else None
    if reading is not None:
        positional = reading.operands
        modelled = model_for(cmd.program)
        if not reading.refused and modelled is not None and modelled.grammar != "words":
            # what the model reads as options: after printf's format, awk's program or `--`, a
            # word that starts with `-` is an argument, and an option's value is its value
            options = [r.text for r in reading.roles if r.kind == "option"]
    if rule.when_options and not any(_has_option(o, spec) for o in options for spec in rule.when_options):
        return None, ""
    strict = rule.decision is not RuleDecision.DENY
    jails_paths = reading is not None or (
        rule.path_args is not None and (rule.path_args.read != "none" or rule.path_args.write != "none")
    )
    if strict:
        for o in options:
            for spec in rule.forbidden_options:
                if _has_option(o, spec):
                    return None, f"option {o} is not allowed ({spec}): drop it"
        if reading is not None and reading.refused:
            return None, reading.refused
        if reading is not None:
            for o in reading.could_be:
                for spec in rule.forbidden_options:
                    if _has_option(o, spec):
                        return None, (
                            f"a run-time word could be the option {o}, which the rule forbids ({spec}): "
                            "put -- before it, or write it literally"
                        )
        if reading is None and rule.forbidden_options and rule.decision is RuleDecision.ALLOW:
            # Without a model, a word known only at run time may be any option, the forbidden
            # ones too (`date "$V"` with V=-f/etc/passwd; xargs' input): only `--` before it
            # makes it an operand. (An ask rule shows the supervisor the word as written.) A
            # word whose option name is written (`-j"$(nproc)"`, `--features="$F"`) is checked
            # by that name above.
            for k in range(i, len(argv)):
                w = argv[k]
                if w.literal and (w.value == "--" or w.value in rule.options_end):
                    break
                if numeric_only(w.raw) and not any(_is_digit_option(spec) for spec in rule.forbidden_options):
                    continue  # a number is at most `-` and digits
                if not w.literal and could_be_option(w) and (w.raw[:1] != "-" or may_split(w)):
                    return None, (
                        f"argument {w.raw or w.value} is known only at run time and could be an option the rule "
                        f"forbids ({', '.join(rule.forbidden_options)[:120]}): put -- before it, or write it literally"
                    )
            if Flag.DYNAMIC_ARGS in cmd.flags:
                return None, (
                    f"its arguments arrive at run time (from {cmd.wrapper}) and could be options the rule forbids"
                )
        if reading is not None and reading.runs:
            return None, (
                f"{'; '.join(reading.runs)}: code the gateway cannot check (gateway/programs/{reading.model}.yaml)"
            )
        if not rule.accept_unknown:
            jailed = jails_paths
            values = _values_of(reading, rule) if reading is not None else frozenset()
            for k in range(i, len(argv)):
                w = argv[k]
                if k in values and not may_split(w):
                    continue  # a message, a name, a pattern or a number, and one word: that value
                # a glob or ~ in a path argument is expanded and checked by the path jail
                listing = producers.starting_points(w) is not None
                named = producers.named_entry(w) is not None  # `build/stamp-$(date +%s)`
                jail_checks = set(w.expansions) <= _JAIL_EXPANDS or listing or named or producers.pipe(w)
                if listing and reading is None and not any(x.literal and x.value == "--" for x in argv[i:k]):
                    # split at blanks, a listed name can be an option (a directory named
                    # 'x --target-directory=y'); with no model to say which options are harmless,
                    # only `--` before it keeps it an operand (a model's reading decides itself)
                    return None, (
                        f"argument {w.raw} lists names at run time, and one could be an option: put -- before it"
                    )
                if not w.literal and not (jailed and jail_checks):
                    return None, (
                        f"argument {w.raw or w.value} is only known at run time: write it literally "
                        "(no $VAR, $(...) or expansion the rule cannot check)"
                    )
            if Flag.DYNAMIC_ARGS in cmd.flags:
                return None, f"its arguments arrive at run time (from {cmd.wrapper}): run it on literal arguments"
        if not rule.writes:
            why = _writes(cmd, reading)
            if why:
                return None, f"{why}, and this rule's commands write no file"
        if Flag.DYNAMIC_ARGS in cmd.flags and jails_paths and not rule.accept_unknown_paths:
            return None, f"its arguments arrive at run time (from {cmd.wrapper}) and could be paths"
        for a in cmd.assignments:
            if not any(_name_matches(a.name, allowed) for allowed in rule.env):
                return (
                    None,
                    f"setting {a.name} is not allowed (the rule allows {', '.join(rule.env) or 'no variables'})",
                )
    if rule.first_arg is not None and not strict and not positional:
        return None, ""  # a deny rule about the first argument does not concern a command without one
    if rule.first_arg is not None and positional:
        first = argv[positional[0]].value
        found = _any_match(_patterns(tuple(rule.first_arg)), first, strict)
        if found is not True:
            allowed = ", ".join(rule.first_arg)[:160]
            why = found or f"first argument {_short(first)} is not one of the allowed ones ({allowed})"
            return None, why if strict else ""
    if rule.args is not None and not strict:
        # A deny rule matches what its args say: some positional argument matching one of them
        # (so never a command without one), or with `args: []`, no positional argument at all.
        patterns = _patterns(tuple(rule.args))
        if not rule.args:
            return (None, "") if positional else (Match(rule, positional, reading), "")
        if not any(_any_match(patterns, argv[k].value, False) is True for k in positional):
            return None, ""
        return Match(rule, positional, reading), ""
    if rule.args is not None:
        patterns = _patterns(tuple(rule.args))
        for k in positional:
            value = argv[k].value
            found = _any_match(patterns, value, strict)
            if found is not True:
                if strict:
                    return (
                        None,
                        found
                        or f"argument {_short(value)} matches none of the allowed patterns ({_listed(rule.args)})",
                    )
                return None, ""
    return Match(rule, positional, reading), ""


_WRITABLE_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def _writes(cmd: Command, reading: Reading | None) -> str:
    """Why `cmd` writes a file ("" when it does not): a redirect into a file, or what its
    program's model says it writes (read whatever the rule's `path_args` say: a rule with
    `writes: false` relies on it); a command the model cannot read may write anything."""
    for r in cmd.redirects:
        target = r.target
        writes = r.mode in (RedirectMode.WRITE, RedirectMode.APPEND) and target is not None
        if writes and target is not None and not (target.literal and target.value in _WRITABLE_DEVICES):
            return f"it writes {target.raw or target.value} (a redirect)"
    found = reading if reading is not None else (reading_of(cmd) if models_subcommand(cmd) else None)
    if found is not None and found.refused:
        return f"its model cannot tell what it writes ({found.refused})"
    if found is not None and found.writes:
        return f"it writes {', '.join(w.value for w in found.writes)[:160]} (gateway/programs/{found.model}.yaml)"
    return ""


_VALUE_KINDS = frozenset({"option", "other", "pattern"})


def _values_of(reading: Reading, rule: Rule) -> frozenset[int]:
    """argv indices of the words the model reads as values that name no file and run nothing (a
    message, a name, a pattern, a number: `git commit -m "$MSG"`, `head -n $((N+1))`), the value
    of an option or an operand; not an operand the rule's `args` or `first_arg` must check."""
    kinds: dict[int, set[str]] = {}
    for r in reading.roles:
        kinds.setdefault(r.index, set()).add(r.kind)
    checked = set(reading.operands) if rule.args is not None else set(reading.operands[:1] if rule.first_arg else ())
    return frozenset(
        k for k, found in kinds.items() if found <= _VALUE_KINDS and found != {"option"} and k not in checked
    )


def _is_digit_option(spec: str) -> bool:
    return len(spec) == 2 and spec[0] == "-" and spec[1].isdigit()


def _any_match(patterns: tuple[PolicyPattern, ...], value: str, strict: bool) -> bool | str:
    """True when a pattern matches `value`; otherwise False, or why no pattern could decide. A
    pattern that needs backtracking does not decide an argument longer than
    MAX_BACKTRACKING_INPUT: an allow or ask rule then does not match (`strict`), a deny rule
    does (fail closed)."""
    undecided = ""
    for p in patterns:
        result = p.fullmatch(value)
        if result:
            return True
        if result is None:
            if not strict:
                return True
            undecided = (
                f"argument of {len(value)} characters is too long to check against the pattern {p.pattern!r}, "
                f"which needs backtracking (at most {MAX_BACKTRACKING_INPUT}): shorten it, or write it to a file"
            )
    return undecided or False


def _listed(patterns: list[str]) -> str:
    return ", ".join(patterns)[:160]


def _short(value: str) -> str:
    return repr(value) if len(value) <= 200 else f"{value[:200]!r}... ({len(value)} characters)"


def _split(cmd: Command, start: int, ends: list[str] | None = None) -> tuple[list[str], tuple[int, ...]]:
    """Options (before `--`) and the indices of positional arguments, from `start` on. `ends`:
    options after whose value the program reads no more options (a rule's `options_end`)."""
    options: list[str] = []
    positional: list[int] = []
    ended = False
    for k in range(start, len(cmd.argv)):
        v = cmd.argv[k].value
        if not ended and ends and v in ends and cmd.argv[k].literal:
            options.append(v)
            ended = True  # its value and what follows are what the program runs: operands to it
        elif not ended and v == "--":
            ended = True
        elif not ended and v.startswith("-") and v != "-":
            options.append(v)
        else:
            positional.append(k)
    return options, tuple(positional)


def _has_option(arg: str, spec: str) -> bool:
    """Does the option word `arg` use the option `spec`, in any spelling?"""
    if spec.startswith("--"):
        if not arg.startswith("--"):
            return False
        name = arg[2:].split("=", 1)[0]
        return bool(name) and spec[2:].startswith(name)  # getopt accepts unique prefixes
    if spec.startswith("-") and len(spec) == 2:
        return not arg.startswith("--") and arg.startswith("-") and spec[1] in arg[1:]
    return arg == spec or arg.startswith(spec + "=")  # e.g. find's -exec, -delete


def _name_matches(name: str, allowed: str) -> bool:
    return name.startswith(allowed[:-1]) if allowed.endswith("*") else name == allowed


@lru_cache(maxsize=1024)
def _patterns(args: tuple[str, ...]) -> tuple[PolicyPattern, ...]:
    return tuple(PolicyPattern(p) for p in args)


def option_values(cmd: Command, start: int, names: list[str]) -> list[int]:
    """argv indices of the values of the options `names` (`-o F`, `-oF`, `--out=F`, `--out F`);
    attached values are returned as the option word's own index. A long option is matched by
    any prefix of its name too (`--from-fi=F` for `--from-file`), as getopt_long and git's
    parse-options accept a unique one: a rule's path options are jailed in every spelling, as
    its forbidden options are refused in every spelling (`_has_option`)."""
    found: list[int] = []
    argv = cmd.argv
    k = start
    while k < len(argv):
        v = argv[k].value
        if v == "--":
            break
        for name in names:
            if name.startswith("--"):
                given, eq, _ = v[2:].partition("=")
                if not (v.startswith("--") and given and name[2:].startswith(given)):
                    continue
                if eq:
                    found.append(k)
                elif k + 1 < len(argv):
                    found.append(k + 1)
                    k += 1
                break
            if v == name and k + 1 < len(argv):
                found.append(k + 1)
                k += 1
                break
            if not v.startswith("--") and v.startswith(name) and len(v) > len(name):
                found.append(k)
                break
        k += 1
    return found


def attached_value(word: str, names: list[str]) -> str:
    """The value attached to the option word `word`, one of `names` in any spelling
    (`--out=F`, `--ou=F`, `-oF`): F."""
    if word.startswith("--"):
        return word.partition("=")[2]
    for name in names:
        if not name.startswith("--") and word.startswith(name):
            return word[len(name) :]
    return word
